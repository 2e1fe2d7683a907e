// nn/checkpoint.hpp: a training run in one safetensors file and back: the model's parameters
// and buffers (named as nn::save names them), the optimizer's state tensors, and in the
// metadata the optimizer's kind, hyperparameters and step count, the caller's counters and
// every dropout stream, so that a resumed run continues bit for bit. See docs/training.md.
#pragma once

#include <algorithm>
#include <bit>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "solder/config.hpp"
#include "solder/expr/random.hpp"
#include "solder/io/safetensors.hpp"
#include "solder/nn/buffer.hpp"
#include "solder/optim/optimizer.hpp"

namespace solder::nn {

/// What a training loop counts besides the optimizer's steps (its own step counter, which
/// micro-batches or skipped steps may set apart from the optimizer's, and the epoch), plus
/// free-form entries of its own (a data order seed, a run name), kept as text.
struct checkpoint_info {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::map<std::string, std::string> extra{};
};

/// A model a checkpoint holds: its parameters and buffers as nn::save writes them, and the
/// hook that re-packs weights after they are loaded. A model with dropout_streams() and
/// set_dropout_streams() (every chain) also has its dropout streams saved and restored.
template <class M>
concept CheckpointModel = requires(M& m) {
  { m.params() } -> std::same_as<std::vector<optim::param>>;
  { m.buffers() } -> std::same_as<std::vector<buffer>>;
  m.parameters_changed();
};

namespace detail {

/// The version of the layout below that this header writes and reads.
inline constexpr std::string_view checkpoint_version = "1";
/// Prefix of the optimizer's tensors and metadata; a model's names ("0.weight") never start so.
inline constexpr std::string_view optimizer_prefix = "optimizer.";
/// Prefix of checkpoint_info::extra's keys in the metadata.
inline constexpr std::string_view extra_prefix = "extra.";

template <class M>
concept HasDropoutStreams = requires(M& m, std::span<const philox_state> s) {
  { m.dropout_streams() } -> std::same_as<std::vector<philox_state>>;
  m.set_dropout_streams(s);
};

/// Shortest decimal text that reads back as the same float (std::to_chars' guarantee).
inline std::string checkpoint_text(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
inline std::string checkpoint_text(bool v) { return v ? "true" : "false"; }
template <std::integral I>
  requires(!std::same_as<I, bool>)
std::string checkpoint_text(I v) {
  return std::to_string(v);
}

/// Reads what checkpoint_text wrote; false unless the whole text is one such value.
inline bool checkpoint_parse(std::string_view t, bool& v) {
  if (t == "true" || t == "false") {
    v = t == "true";
    return true;
  }
  return false;
}
template <class T>
  requires(std::floating_point<T> || (std::integral<T> && !std::same_as<T, bool>))
bool checkpoint_parse(std::string_view t, T& v) {
  T x{};
  const auto r = std::from_chars(t.data(), t.data() + t.size(), x);
  if (t.empty() || r.ec != std::errc() || r.ptr != t.data() + t.size()) return false;
  v = x;
  return true;
}

/// A tensor of the file to read into `dest` once every tensor is known to be there.
struct checkpoint_read {
  std::string name;
  std::vector<std::size_t> dims;
  float* dest = nullptr;
  std::vector<float> staged{};
};

}  // namespace detail

/// Writes a checkpoint to `path` (atomically: a temporary file, then a rename). Tensors: every
/// parameter and buffer of `model` as nn::save names them ("0.weight"; the file loads with
/// nn::load, and in PyTorch with safetensors' load_file), then each tensor of opt.state() as
/// "optimizer." + its name ("optimizer.state.0.exp_avg"). Metadata, as decimal text:
/// "solder.checkpoint" (the layout's version), "optimizer" (its kind), "optimizer.steps",
/// "optimizer.<hyperparameter>" for each, "optimizer.params" and "optimizer.param.<k>" (the
/// names of the optimizer's parameters), "train.step", "train.epoch", "dropout.streams" and
/// "dropout.<i>.seed" / ".offset" / ".first" / ".rounds" for every dropout layer,
/// "extra.<key>" for each entry of info.extra. Throws solder::error for an empty extra key or an
/// I/O failure.
template <CheckpointModel Model, optim::StatefulOptimizer Optimizer>
void save_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& opt, const checkpoint_info& info = {}) {
  constexpr const char* who = "solder::nn::save_checkpoint";
  std::vector<io::named_tensor> tensors;
  for (const optim::param& p : model.params()) tensors.push_back({p.name, p.dims, p.value.data()});
  for (const buffer& b : model.buffers()) tensors.push_back({b.name, b.dims, b.value.data()});
  for (const optim::state_tensor& s : opt.state())
    tensors.push_back({std::string(detail::optimizer_prefix) + s.name, s.dims, s.value.data()});

  io::safetensors_metadata md;
  md["format"] = "pt";  // what transformers' loaders look for in a safetensors file
  md["solder.checkpoint"] = std::string(detail::checkpoint_version);
  md["optimizer"] = std::string(std::string_view(Optimizer::kind));
  md["optimizer.steps"] = detail::checkpoint_text(opt.steps());
  Optimizer::options::for_each_field(opt.hyperparameters(), [&](const char* name, const auto& v) {
    md[std::string(detail::optimizer_prefix) + name] = detail::checkpoint_text(v);
  });
  const std::span<const optim::param> ps = opt.params();
  md["optimizer.params"] = detail::checkpoint_text(ps.size());
  for (std::size_t k = 0; k < ps.size(); ++k) md["optimizer.param." + std::to_string(k)] = ps[k].name;
  md["train.step"] = detail::checkpoint_text(info.step);
  md["train.epoch"] = detail::checkpoint_text(info.epoch);
  if constexpr (detail::HasDropoutStreams<Model>) {
    const std::vector<philox_state> streams = model.dropout_streams();
    md["dropout.streams"] = detail::checkpoint_text(streams.size());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const std::string at = "dropout." + std::to_string(i) + ".";
      md[at + "seed"] = detail::checkpoint_text(streams[i].seed);
      md[at + "offset"] = detail::checkpoint_text(streams[i].offset);
      md[at + "first"] = detail::checkpoint_text(streams[i].first);
      md[at + "rounds"] = detail::checkpoint_text(streams[i].rounds);
    }
  }
  for (const auto& [key, value] : info.extra) {
    if (key.empty()) io::detail::st_fail(who, path, "checkpoint_info::extra has an empty key");
    md[std::string(detail::extra_prefix) + key] = value;
  }
  io::save_safetensors(path, tensors, md);
}

/// Restores what save_checkpoint wrote into `model` and `opt` (built as for the saved run: the
/// same layers, the same optimizer kind over the same parameters) and returns the caller's
/// counters. Restored: parameters, buffers, the optimizer's state tensors, step count and
/// hyperparameters (as torch's load_state_dict restores the param group; set_lr afterwards to
/// change the rate), every dropout stream (seed, offset, first, rounds; a file without rounds
/// ran 10). All or nothing: a file that is missing, truncated or malformed, not a checkpoint, of
/// another optimizer kind, of another parameter list, with a tensor missing or of another shape,
/// or with metadata that does not read, throws solder::error naming the file and the problem, and
/// leaves model and opt unchanged.
template <CheckpointModel Model, optim::StatefulOptimizer Optimizer>
checkpoint_info load_checkpoint(const std::filesystem::path& path, Model& model, Optimizer& opt) {
  constexpr const char* who = "solder::nn::load_checkpoint";
  const auto fail = [&](const std::string& what) { io::detail::st_fail(who, path, what); };
  // One open file for header and data: a checkpoint replaced meanwhile (a rename) is not mixed in.
  std::ifstream in;
  const io::safetensors_header h = io::detail::read_header(in, who, path);
  const io::safetensors_metadata& md = h.metadata;

  const auto version = md.find("solder.checkpoint");
  if (version == md.end())
    fail("is not a solder checkpoint (its metadata has no 'solder.checkpoint' entry); a file of parameters loads with "
         "nn::load");
  if (version->second != detail::checkpoint_version)
    fail("is a checkpoint of layout version '" + version->second + "'; this solder reads version " +
         std::string(detail::checkpoint_version));
  const auto text = [&](const std::string& key) -> const std::string& {
    const auto it = md.find(key);
    if (it == md.end()) fail("the metadata has no '" + key + "' entry");
    return it->second;
  };
  const auto read = [&](const std::string& key, auto& v) {
    const std::string& t = text(key);
    if (!detail::checkpoint_parse(t, v)) fail("metadata entry '" + key + "' = \"" + t + "\" does not read as a value of its kind");
  };

  // The optimizer: its kind, hyperparameters (checked below, by set_hyperparameters), steps and
  // the parameters it was built over.
  const std::string_view kind = Optimizer::kind;
  if (text("optimizer") != kind)
    fail("holds the state of optimizer '" + text("optimizer") + "', not '" + std::string(kind) +
         "'; resume with the optimizer the run was saved with");
  typename Optimizer::options hyper = opt.hyperparameters();
  Optimizer::options::for_each_field(hyper, [&](const char* name, auto& v) { read(std::string(detail::optimizer_prefix) + name, v); });
  std::int64_t steps = 0;
  read("optimizer.steps", steps);
  if (steps < 0) fail("metadata entry 'optimizer.steps' is negative (" + std::to_string(steps) + ")");
  const std::span<const optim::param> ps = opt.params();
  std::size_t saved_params = 0;
  read("optimizer.params", saved_params);
  if (saved_params != ps.size())
    fail("the saved optimizer has " + std::to_string(saved_params) + " parameters; this one has " +
         std::to_string(ps.size()));
  for (std::size_t k = 0; k < ps.size(); ++k)
    if (const std::string& n = text("optimizer.param." + std::to_string(k)); n != ps[k].name)
      fail("the saved optimizer's parameter " + std::to_string(k) + " is '" + n + "'; this one's is '" + ps[k].name + "'");

  checkpoint_info info;
  read("train.step", info.step);
  read("train.epoch", info.epoch);
  for (const auto& [key, value] : md)
    if (key.size() > detail::extra_prefix.size() && key.starts_with(detail::extra_prefix))
      info.extra[key.substr(detail::extra_prefix.size())] = value;

  std::vector<philox_state> streams;
  if constexpr (detail::HasDropoutStreams<Model>) {
    std::size_t count = 0;
    read("dropout.streams", count);
    const std::size_t layers = model.dropout_streams().size();
    if (count != layers)
      fail("the checkpoint has " + std::to_string(count) + " dropout streams; the model has " + std::to_string(layers) +
           " dropout layers");
    streams.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      const std::string at = "dropout." + std::to_string(i) + ".";
      read(at + "seed", streams[i].seed);
      read(at + "offset", streams[i].offset);
      read(at + "first", streams[i].first);
      // A checkpoint written before the streams kept their rounds ran Philox4x32-10.
      streams[i].rounds = 10;
      if (md.contains(at + "rounds")) read(at + "rounds", streams[i].rounds);
      if (!random::philox_rounds_supported(streams[i].rounds))
        fail("metadata entry '" + at + "rounds' is " + std::to_string(streams[i].rounds) +
             "; a dropout stream runs 7 or 10 Philox rounds");
    }
  }

  // The tensors: every one requested, read into staging; the file's optimizer state must be
  // exactly this optimizer's.
  std::vector<detail::checkpoint_read> reads;
  for (const optim::param& p : model.params()) reads.push_back({p.name, p.dims, p.value.data()});
  for (const buffer& b : model.buffers()) reads.push_back({b.name, b.dims, b.value.data()});
  const std::size_t model_tensors = reads.size();
  const std::vector<optim::state_tensor> state = opt.state();
  for (const optim::state_tensor& s : state)
    reads.push_back({std::string(detail::optimizer_prefix) + s.name, s.dims, s.value.data()});

  std::unordered_map<std::string_view, const io::safetensors_entry*> by_name;
  for (const io::safetensors_entry& e : h.tensors) by_name.emplace(e.name, &e);
  std::string missing;
  for (const detail::checkpoint_read& r : reads)
    if (!by_name.count(r.name)) missing += (missing.empty() ? "'" : ", '") + r.name + "'";
  if (!missing.empty()) fail("no tensor named " + missing + " in the file");
  for (const io::safetensors_entry& e : h.tensors)
    if (e.name.starts_with("optimizer.state.") &&
        std::none_of(state.begin(), state.end(), [&](const optim::state_tensor& s) {
          return std::string(detail::optimizer_prefix) + s.name == e.name;
        }))
      fail("holds optimizer state '" + e.name + "' that this " + std::string(kind) + " does not have");
  for (detail::checkpoint_read& r : reads) {
    const io::safetensors_entry& e = *by_name.at(r.name);
    if (e.dtype != "F32") fail("tensor '" + r.name + "' has dtype " + e.dtype + "; a checkpoint holds F32 only");
    if (e.shape != r.dims)
      fail("tensor '" + r.name + "' has shape " + io::detail::shape_text(e.shape) + " in the file, but " +
           (&r - reads.data() < std::ptrdiff_t(model_tensors) ? "the model" : "the optimizer") + " expects " +
           io::detail::shape_text(r.dims));
    r.staged.resize(static_cast<std::size_t>((e.end - e.begin) / 4));
    in.seekg(std::streamoff(h.data_start + e.begin));
    in.read(reinterpret_cast<char*>(r.staged.data()), std::streamsize(r.staged.size() * 4));
    if (!in) fail("read error in the data of tensor '" + r.name + "'");
    if constexpr (std::endian::native == std::endian::big)
      for (float& v : r.staged) v = std::bit_cast<float>(__builtin_bswap32(std::bit_cast<std::uint32_t>(v)));
  }

  // Commit. set_hyperparameters and restore_state check before they change anything; the
  // hyperparameters are put back if the state is refused. Nothing after them can fail.
  std::vector<optim::saved_state> saved;
  for (std::size_t i = model_tensors; i < reads.size(); ++i)
    saved.push_back({state[i - model_tensors].name, reads[i].staged});
  const typename Optimizer::options before = opt.hyperparameters();
  try {
    opt.set_hyperparameters(hyper);
  } catch (const solder::error& e) {
    fail(std::string("the saved hyperparameters are refused: ") + e.what());
  }
  try {
    optim::restore_state(opt, saved, steps);
  } catch (...) {
    opt.set_hyperparameters(before);
    throw;
  }
  for (std::size_t i = 0; i < model_tensors; ++i)
    if (!reads[i].staged.empty()) std::memcpy(reads[i].dest, reads[i].staged.data(), reads[i].staged.size() * sizeof(float));
  if constexpr (detail::HasDropoutStreams<Model>) model.set_dropout_streams(streams);
  model.parameters_changed();
  return info;
}

}  // namespace solder::nn
