# SHARDOPT_GPU_KERNELS_ONLY=ON: the kernels layer alone with its CUDA backend, the GPU tests,
# test_ns_driver and ns_bench_cuda. For a GPU machine that has CUDA but not the rest of the
# stack (MPI, hwloc, OpenBLAS, oneDNN, cJSON): kernels/ needs none of them apart from the CPU
# Newton-Schulz, which is left out. tests/gpu/device_check.sh picks this when the full configure
# cannot find its dependencies.
set(CMAKE_CUDA_ARCHITECTURES_DEFAULT 90 80)
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES_DEFAULT})
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/CudaVersion.cmake)
find_package(OpenMP REQUIRED COMPONENTS C)

add_library(shardopt_gpu_kernels STATIC
  kernels/rng.c kernels/ns_coeffs.c kernels/device.c kernels/cpu/elementwise_ref.c
  kernels/cpu/misc_ref.c kernels/cuda/ops_cuda.cu kernels/cuda/elementwise.cu kernels/cuda/ns_cuda.cu
  kernels/cuda/ns_shard_cuda.cu
  base/mem.c base/status.c base/log.c base/env.c) # the allocator, the recorded errors and the
  # env gateway log.c reads through (plain libc)
target_include_directories(shardopt_gpu_kernels PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}
  ${CMAKE_CURRENT_SOURCE_DIR}/include)
target_compile_options(shardopt_gpu_kernels PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false --Werror all-warnings -Xcompiler=-Wall,-Wextra>)
target_link_libraries(shardopt_gpu_kernels PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt OpenMP::OpenMP_C m)

enable_testing()
add_library(shardopt_test_harness STATIC tests/test_main.c)
target_include_directories(shardopt_test_harness PUBLIC tests)
foreach(t test_cuda_memory test_cuda_kernels)
  add_executable(${t} tests/gpu/${t}.c tests/main_plain.c)
  target_link_libraries(${t} PRIVATE shardopt_test_harness shardopt_gpu_kernels)
  add_test(NAME ${t} COMMAND ${t})
  set_tests_properties(${t} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endforeach()
add_executable(test_ns_driver tests/unit/test_ns_driver.c tests/unit/ns_driver_host.cu
  tests/main_plain.c)
target_compile_options(test_ns_driver PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false>)
target_link_libraries(test_ns_driver PRIVATE shardopt_test_harness shardopt_gpu_kernels)
add_test(NAME test_ns_driver COMMAND test_ns_driver)
set_tests_properties(test_ns_driver PROPERTIES LABELS unit)

add_executable(ns_bench_cuda bench/ns_bench_cuda_main.c bench/ns_bench_cuda.cu)
target_link_libraries(ns_bench_cuda PRIVATE shardopt_gpu_kernels)
message(STATUS "shardopt: kernels-only GPU build (SHARDOPT_GPU_KERNELS_ONLY)")
