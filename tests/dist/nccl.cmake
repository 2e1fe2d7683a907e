# tests/dist/nccl.cmake: the NCCL programs, each one process with one rank per visible GPU (label
# gpu): solder_dist_nccl_reduce (test dist:nccl_reduce), the bucket reduction against the host's
# bits; solder_dist_nccl_train (test dist:nccl_train), the digits MLP behind its generated C
# interface (solder_kernels) trained data-parallel against one GPU's train_step. They return 77 (ctest:
# "Skipped") without a GPU. Built with SOLDER_BUILD_CUDA where libnccl and nccl.h are
# found, the CUDA toolkit's directories first; SOLDER_NCCL_LIBRARY and SOLDER_NCCL_INCLUDE_DIR
# pick another NCCL.
if(SOLDER_BUILD_CUDA)
  find_library(SOLDER_NCCL_LIBRARY NAMES nccl HINTS "${CUDAToolkit_LIBRARY_DIR}"
    DOC "libnccl, for the NCCL tests")
  find_path(SOLDER_NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
    DOC "The directory of nccl.h, for the NCCL tests")
  if(NOT SOLDER_NCCL_LIBRARY OR NOT SOLDER_NCCL_INCLUDE_DIR)
    message(STATUS "solder: NCCL not found (libnccl: ${SOLDER_NCCL_LIBRARY}, nccl.h: ${SOLDER_NCCL_INCLUDE_DIR}); "
                   "dist:nccl_reduce is not built. Set SOLDER_NCCL_LIBRARY and SOLDER_NCCL_INCLUDE_DIR to use one.")
  else()
    message(STATUS "solder: NCCL found: ${SOLDER_NCCL_LIBRARY}")
    find_package(Threads REQUIRED)  # the per-rank path runs one thread per GPU
    add_executable(solder_dist_nccl_reduce "${CMAKE_CURRENT_LIST_DIR}/nccl_reduce.cu")
    target_include_directories(solder_dist_nccl_reduce PRIVATE
      "${PROJECT_SOURCE_DIR}/tests" "${PROJECT_SOURCE_DIR}/include" "${SOLDER_NCCL_INCLUDE_DIR}")
    target_link_libraries(solder_dist_nccl_reduce PRIVATE
      solder::solder CUDA::cudart "${SOLDER_NCCL_LIBRARY}" Threads::Threads)
    solder_internal_target(solder_dist_nccl_reduce NO_SANITIZE)
    if(TARGET solder_cuda_tests)
      add_dependencies(solder_cuda_tests solder_dist_nccl_reduce)
    endif()
    add_test(NAME "dist:nccl_reduce" COMMAND solder_dist_nccl_reduce)
    set_tests_properties("dist:nccl_reduce" PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77)

    if(TARGET solder_kernels)
      add_executable(solder_dist_nccl_train "${CMAKE_CURRENT_LIST_DIR}/nccl_train.cu")
      target_include_directories(solder_dist_nccl_train PRIVATE
        "${PROJECT_SOURCE_DIR}/tests" "${PROJECT_SOURCE_DIR}/include" "${SOLDER_NCCL_INCLUDE_DIR}")
      target_link_libraries(solder_dist_nccl_train PRIVATE
        solder_kernels solder::solder CUDA::cudart "${SOLDER_NCCL_LIBRARY}")
      solder_internal_target(solder_dist_nccl_train NO_SANITIZE)
      if(TARGET solder_cuda_tests)
        add_dependencies(solder_cuda_tests solder_dist_nccl_train)
      endif()
      add_test(NAME "dist:nccl_train" COMMAND solder_dist_nccl_train)
      set_tests_properties("dist:nccl_train" PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77)
    endif()
  endif()
endif()
