"""`salactl profile`: one prefill and/or decode step of the runtime with NVTX ranges per layer and
op, run under Nsight Compute (`ncu_runner`), torch.profiler (`torch_mode`) or sampled with NVML."""
