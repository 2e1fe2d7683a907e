// tests/nn/checkpoint.test.cpp: save_checkpoint / load_checkpoint. A chain with dropout trained
// k steps, saved, trained m more, against a fresh model and optimizer loaded from the file and
// trained the same m steps: the same bits (AdamW with a schedule, SGD with momentum); what the
// file holds (nn::load still reads it); and the errors (truncated file, another optimizer kind,
// a model of another shape, a parameter file, bad metadata, a missing state tensor), each
// leaving model and optimizer unchanged, byte for byte.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/io/safetensors.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/checkpoint.hpp"
#include "solder/nn/state.hpp"
#include "solder/optim/adam.hpp"
#include "solder/optim/schedule.hpp"
#include "solder/optim/sgd.hpp"
#include "support/data.hpp"
#include "support/temp_dir.hpp"

namespace {

using Catch::Matchers::Contains;
using solder::test::bit_differences;
using namespace solder;

using net = nn::chain<nn::linear<8, 16>, nn::relu, nn::dropout<0.2f>, nn::linear<16, 3>>;
/// The same layers with another hidden width: its file has other shapes.
using wider_net = nn::chain<nn::linear<8, 12>, nn::relu, nn::dropout<0.2f>, nn::linear<12, 3>>;

constexpr std::size_t batch_rows = 24;
constexpr int batches = 5;

/// Step t's batch: seeded inputs and labels, cycling through `batches` of them.
struct data_set {
  std::vector<tensor<float, shape<dyn, 8>>> x;
  std::vector<std::vector<std::int32_t>> y;
  data_set() {
    for (int b = 0; b < batches; ++b) {
      x.emplace_back(batch_rows);
      solder::test::fill_uniform(x.back(), -1, 1, 300 + std::uint32_t(b));
      std::vector<std::int32_t> labels(batch_rows);
      for (std::size_t i = 0; i < batch_rows; ++i) labels[i] = std::int32_t((i * 5 + std::size_t(b)) % 3);
      y.push_back(labels);
    }
  }
};

std::vector<float> weights(net& model) {
  std::vector<float> w;
  for (const optim::param& p : model.params()) w.insert(w.end(), p.value.begin(), p.value.end());
  return w;
}

template <class Opt>
std::vector<float> state_values(Opt& opt) {
  std::vector<float> out;
  for (const optim::state_tensor& s : opt.state()) out.insert(out.end(), s.value.begin(), s.value.end());
  return out;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bit_differences(a.data(), b.data(), a.size()) == 0;
}

/// Every hyperparameter of o as a float (a bool as 0 or 1), for a bitwise comparison.
template <class Options>
std::vector<float> option_values(const Options& o) {
  std::vector<float> out;
  Options::for_each_field(o, [&](const char*, const auto& v) { out.push_back(float(v)); });
  return out;
}

bool same_streams(const std::vector<philox_state>& a, const std::vector<philox_state>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].seed != b[i].seed || a[i].offset != b[i].offset || a[i].first != b[i].first || a[i].rounds != b[i].rounds)
      return false;
  return true;
}

/// Everything a failed load must leave alone.
template <class Opt>
struct snapshot {
  std::vector<float> w, state;
  std::int64_t steps;
  std::vector<philox_state> streams;
  typename Opt::options hyper;
  snapshot(net& model, Opt& opt)
      : w(weights(model)), state(state_values(opt)), steps(opt.steps()), streams(model.dropout_streams()),
        hyper(opt.hyperparameters()) {}
  bool unchanged(net& model, Opt& opt) const {
    return same(w, weights(model)) && same(state, state_values(opt)) && steps == opt.steps() &&
           same_streams(streams, model.dropout_streams()) &&
           same(option_values(hyper), option_values(opt.hyperparameters()));
  }
};

/// Trains k steps, saves, trains m more (W1); a fresh model and optimizer (other seeds, other
/// hyperparameters) load the file and train the same m steps (W2). `step` runs training step t.
template <class Opt>
void check_resume(const typename Opt::options& run_options, const typename Opt::options& fresh_options,
                  const std::function<void(net&, Opt&, int)>& step) {
  const solder::test::temp_dir tmp("checkpoint_resume");
  const auto path = tmp.path / "run.safetensors";
  constexpr int k = 7, m = 6;

  net uninterrupted(5);
  Opt ou(uninterrupted.params(), run_options);
  for (int t = 0; t < k + m; ++t) step(uninterrupted, ou, t);

  net a(5);
  Opt oa(a.params(), run_options);
  for (int t = 0; t < k; ++t) step(a, oa, t);
  nn::save_checkpoint(path, a, oa, {.step = k, .epoch = 2, .extra = {{"data_seed", "2026"}, {"run", "resume test"}}});
  const std::vector<float> saved_options = option_values(oa.hyperparameters());
  for (int t = k; t < k + m; ++t) step(a, oa, t);
  const std::vector<float> w1 = weights(a);
  CHECK(same(w1, weights(uninterrupted)));  // saving changes nothing

  net b(99);
  Opt ob(b.params(), fresh_options);
  const nn::checkpoint_info info = nn::load_checkpoint(path, b, ob);
  CHECK(info.step == k);
  CHECK(info.epoch == 2);
  CHECK(info.extra == std::map<std::string, std::string>{{"data_seed", "2026"}, {"run", "resume test"}});
  CHECK(ob.steps() == k);
  CHECK(same(option_values(ob.hyperparameters()), saved_options));  // restored, as torch's load_state_dict
  for (int t = k; t < k + m; ++t) step(b, ob, t);
  const std::vector<float> w2 = weights(b);
  CHECK(same(w1, w2));
  CHECK(same(state_values(oa), state_values(ob)));
  CHECK(same_streams(a.dropout_streams(), b.dropout_streams()));
  CHECK(ob.steps() == oa.steps());

  // The dropout streams matter: the same load with the streams started afresh draws other masks.
  net c(99);
  Opt oc(c.params(), fresh_options);
  nn::load_checkpoint(path, c, oc);
  std::vector<philox_state> streams = c.dropout_streams();
  REQUIRE(streams.size() == 1);
  CHECK(streams[0].offset != 0);
  streams[0].offset = 0;
  c.set_dropout_streams(streams);
  for (int t = k; t < k + m; ++t) step(c, oc, t);
  CHECK(!same(w1, weights(c)));
}

/// Reads every tensor and the metadata of `from`, lets `edit` change them, writes `to`.
void rewrite(const std::filesystem::path& from, const std::filesystem::path& to,
             const std::function<void(std::vector<io::safetensors_entry>&, io::safetensors_metadata&)>& edit) {
  io::safetensors_header h = io::read_safetensors_header(from);
  std::vector<std::vector<float>> data;
  std::vector<io::named_tensor_ref> refs;
  data.reserve(h.tensors.size());
  for (const io::safetensors_entry& e : h.tensors) {
    data.emplace_back((e.end - e.begin) / 4);
    refs.push_back({e.name, e.shape, data.back().data()});
  }
  io::load_safetensors(from, refs);
  std::vector<io::safetensors_entry> entries = h.tensors;
  edit(entries, h.metadata);
  std::vector<io::named_tensor> out;
  for (const io::safetensors_entry& e : entries)
    for (std::size_t i = 0; i < h.tensors.size(); ++i)
      if (h.tensors[i].name == e.name) out.push_back({e.name, e.shape, data[i].data()});
  io::save_safetensors(to, out, h.metadata);
}

}  // namespace

TEST_CASE("checkpoint: a resumed AdamW run with a schedule is bitwise the uninterrupted one", "[checkpoint]") {
  const data_set d;
  const auto schedule = optim::warmup_cosine_lr(3e-3, 4, 13, 0.1);
  check_resume<optim::adamw>({.lr = 3e-3f, .beta2 = 0.99f, .weight_decay = 0.05f}, {.lr = 1e-1f},
                             [&](net& model, optim::adamw& opt, int t) {
                               opt.set_lr(schedule(opt.steps()));
                               model.train_step(d.x[std::size_t(t % batches)], d.y[std::size_t(t % batches)], opt);
                             });
}

TEST_CASE("checkpoint: a resumed SGD run with Nesterov momentum is bitwise the uninterrupted one", "[checkpoint]") {
  const data_set d;
  check_resume<optim::sgd>({.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = true},
                           {.lr = 0.5f, .momentum = 0.2f}, [&](net& model, optim::sgd& opt, int t) {
                             model.train_step(d.x[std::size_t(t % batches)], d.y[std::size_t(t % batches)], opt);
                           });
}

TEST_CASE("checkpoint: a dropout stream keeps its Philox rounds; a file without them ran 10", "[checkpoint]") {
  const solder::test::temp_dir tmp("checkpoint_rounds");
  const auto path = tmp.path / "ten.safetensors";
  const data_set d;
  net a(3);
  std::vector<philox_state> streams = a.dropout_streams();
  REQUIRE(streams.size() == 1);
  CHECK(streams[0].rounds == 7);
  streams[0].rounds = 10;
  a.set_dropout_streams(streams);
  optim::adamw opt(a.params());
  a.train_step(d.x[0], d.y[0], opt);
  nn::save_checkpoint(path, a, opt);
  CHECK(io::read_safetensors_header(path).metadata.at("dropout.0.rounds") == "10");

  net b(5);
  optim::adamw ob(b.params());
  nn::load_checkpoint(path, b, ob);
  CHECK(b.dropout_streams().at(0).rounds == 10);
  CHECK(same_streams(a.dropout_streams(), b.dropout_streams()));
  // The next steps draw the same 10-round masks.
  a.train_step(d.x[1], d.y[1], opt);
  b.train_step(d.x[1], d.y[1], ob);
  CHECK(same(weights(a), weights(b)));

  // A checkpoint from before the streams kept their rounds (a 7-round one with the entry taken
  // out): read as the 10 rounds such a file ran.
  const auto seven = tmp.path / "seven.safetensors", old_file = tmp.path / "old.safetensors";
  {
    net e(3);
    optim::adamw oe(e.params());
    nn::save_checkpoint(seven, e, oe);
  }
  rewrite(seven, old_file, [](auto&, auto& md) { md.erase("dropout.0.rounds"); });
  net c(5);
  optim::adamw oc(c.params());
  nn::load_checkpoint(seven, c, oc);
  CHECK(c.dropout_streams().at(0).rounds == 7);
  nn::load_checkpoint(old_file, c, oc);
  CHECK(c.dropout_streams().at(0).rounds == 10);
}

TEST_CASE("checkpoint: the file holds the model as nn::save names it, the state and the metadata", "[checkpoint]") {
  const solder::test::temp_dir tmp("checkpoint_file");
  const auto path = tmp.path / "run.safetensors";
  const data_set d;
  net a(3);
  optim::adamw opt(a.params(), {.lr = 2e-3f});
  for (int t = 0; t < 3; ++t) a.train_step(d.x[std::size_t(t)], d.y[std::size_t(t)], opt);
  nn::save_checkpoint(path, a, opt, {.step = 3, .epoch = 0, .extra = {{"note", "x"}}});

  const io::safetensors_header h = io::read_safetensors_header(path);
  std::vector<std::string> names;
  for (const io::safetensors_entry& e : h.tensors) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias", "optimizer.state.0.exp_avg",
                                          "optimizer.state.0.exp_avg_sq", "optimizer.state.1.exp_avg",
                                          "optimizer.state.1.exp_avg_sq", "optimizer.state.2.exp_avg",
                                          "optimizer.state.2.exp_avg_sq", "optimizer.state.3.exp_avg",
                                          "optimizer.state.3.exp_avg_sq"});
  CHECK(h.tensors[4].shape == std::vector<std::size_t>{16, 8});  // shaped as its parameter
  const auto& md = h.metadata;
  CHECK(md.at("solder.checkpoint") == "1");
  CHECK(md.at("optimizer") == "adamw");
  CHECK(md.at("optimizer.steps") == "3");
  CHECK(md.at("optimizer.lr") == "0.002");
  CHECK(md.at("optimizer.beta2") == "0.999");
  CHECK(md.at("optimizer.weight_decay") == "0.01");
  CHECK(md.at("optimizer.params") == "4");
  CHECK(md.at("optimizer.param.2") == "3.weight");
  CHECK(md.at("train.step") == "3");
  CHECK(md.at("train.epoch") == "0");
  CHECK(md.at("extra.note") == "x");
  const philox_state s = a.dropout_streams().at(0);
  CHECK(md.at("dropout.streams") == "1");
  CHECK(md.at("dropout.0.seed") == std::to_string(s.seed));
  CHECK(md.at("dropout.0.offset") == std::to_string(s.offset));
  CHECK(md.at("dropout.0.first") == "0");
  CHECK(md.at("dropout.0.rounds") == "7");

  net b(8);
  nn::load(b, path);  // a checkpoint is a parameter file too
  CHECK(same(weights(a), weights(b)));
}

TEST_CASE("checkpoint: a bad file is an error naming it, and changes nothing", "[checkpoint]") {
  const solder::test::temp_dir tmp("checkpoint_errors");
  const auto good = tmp.path / "good.safetensors";
  const data_set d;
  {
    net a(3);
    optim::adamw opt(a.params(), {.lr = 2e-3f});
    for (int t = 0; t < 3; ++t) a.train_step(d.x[std::size_t(t)], d.y[std::size_t(t)], opt);
    nn::save_checkpoint(good, a, opt, {.step = 3});
  }
  // The model and optimizer that the failed loads must leave alone: trained, so every byte
  // (weights, moments, step count, dropout offset) differs from the file's.
  net model(11);
  optim::adamw opt(model.params(), {.lr = 1e-2f, .weight_decay = 0.1f});
  for (int t = 0; t < 2; ++t) model.train_step(d.x[std::size_t(t + 2)], d.y[std::size_t(t + 2)], opt);
  const snapshot<optim::adamw> before(model, opt);

  SECTION("a truncated file") {
    std::ifstream in(good, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto bad = tmp.write("truncated.safetensors", bytes.substr(0, bytes.size() - 100));
    CHECK_THROWS_WITH(nn::load_checkpoint(bad, model, opt),
                      Contains("solder::nn::load_checkpoint") && Contains("truncated.safetensors") && Contains("truncated"));
  }
  SECTION("no file") {
    CHECK_THROWS_WITH(nn::load_checkpoint(tmp.path / "none.safetensors", model, opt), Contains("no such file"));
  }
  SECTION("another optimizer kind") {
    net a(3);
    optim::sgd sgd(a.params(), {.lr = 0.1f, .momentum = 0.9f});
    const auto path = tmp.path / "sgd.safetensors";
    nn::save_checkpoint(path, a, sgd);
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt), Contains("holds the state of optimizer 'sgd', not 'adamw'"));
  }
  SECTION("a model of another shape") {
    wider_net w(3);
    optim::adamw wo(w.params());
    const auto path = tmp.path / "wider.safetensors";
    nn::save_checkpoint(path, w, wo);
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("tensor '0.weight' has shape [12, 8] in the file, but the model expects [16, 8]"));
  }
  SECTION("a parameter file, not a checkpoint") {
    const auto path = tmp.path / "params.safetensors";
    nn::save(model, path);
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt), Contains("is not a solder checkpoint"));
  }
  SECTION("a missing optimizer state tensor") {
    const auto path = tmp.path / "missing.safetensors";
    rewrite(good, path, [](auto& entries, auto&) { entries.pop_back(); });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("no tensor named 'optimizer.state.3.exp_avg_sq' in the file"));
  }
  SECTION("metadata that does not read") {
    const auto path = tmp.path / "metadata.safetensors";
    rewrite(good, path, [](auto&, auto& md) { md["optimizer.lr"] = "0.001x"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("metadata entry 'optimizer.lr' = \"0.001x\" does not read"));
    rewrite(good, path, [](auto&, auto& md) { md.erase("dropout.0.offset"); });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt), Contains("the metadata has no 'dropout.0.offset' entry"));
    rewrite(good, path, [](auto&, auto& md) { md["dropout.0.rounds"] = "8"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("metadata entry 'dropout.0.rounds' is 8; a dropout stream runs 7 or 10 Philox rounds"));
    rewrite(good, path, [](auto&, auto& md) { md["dropout.streams"] = "2"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("the checkpoint has 2 dropout streams; the model has 1 dropout layers"));
    rewrite(good, path, [](auto&, auto& md) { md["solder.checkpoint"] = "7"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt), Contains("layout version '7'"));
  }
  SECTION("hyperparameters the optimizer refuses") {
    const auto path = tmp.path / "hyper.safetensors";
    rewrite(good, path, [](auto&, auto& md) { md["optimizer.beta1"] = "1"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("the saved hyperparameters are refused") && Contains("beta1 must be in [0, 1)"));
  }
  SECTION("another parameter list") {
    const auto path = tmp.path / "names.safetensors";
    rewrite(good, path, [](auto&, auto& md) { md["optimizer.param.1"] = "0.bias_renamed"; });
    CHECK_THROWS_WITH(nn::load_checkpoint(path, model, opt),
                      Contains("the saved optimizer's parameter 1 is '0.bias_renamed'; this one's is '0.bias'"));
    std::vector<optim::param> some = model.params();
    some.pop_back();
    optim::adamw partial(some);
    const snapshot<optim::adamw> partial_before(model, partial);
    CHECK_THROWS_WITH(nn::load_checkpoint(good, model, partial),
                      Contains("the saved optimizer has 4 parameters; this one has 3"));
    CHECK(partial_before.unchanged(model, partial));
  }
  CHECK(before.unchanged(model, opt));
  // And the good file still loads into them.
  nn::load_checkpoint(good, model, opt);
  CHECK(opt.steps() == 3);
}

TEST_CASE("checkpoint: sgd's momentum must be zero or non-zero on both sides", "[checkpoint]") {
  const solder::test::temp_dir tmp("checkpoint_sgd");
  const auto path = tmp.path / "sgd.safetensors";
  net a(3), b(4);
  optim::sgd with(a.params(), {.lr = 0.1f, .momentum = 0.9f});
  optim::sgd without(b.params(), {.lr = 0.1f});
  nn::save_checkpoint(path, a, with);
  const snapshot<optim::sgd> before(b, without);
  CHECK_THROWS_WITH(nn::load_checkpoint(path, b, without),
                    Contains("holds optimizer state 'optimizer.state.0.momentum_buffer' that this sgd does not have"));
  CHECK(before.unchanged(b, without));
}
