# The CUDA backend's toolkit floor: batched elementwise launches pass up to 32 KiB of kernel
# parameters, which CUDA allows from 12.1 on.
if(CUDAToolkit_VERSION VERSION_LESS 12.1)
  message(FATAL_ERROR "the CUDA backend needs CUDA >= 12.1 (found ${CUDAToolkit_VERSION}); "
    "configure with -DSHARDOPT_WITH_CUDA=OFF for the CPU backend alone")
endif()
