cd benchmarks && python decode_attention_bench.py --configs 10,18,23 --rounds 5 --cases "128K b1,128K b2,128K b3,128K b4,4K b2,4K b4,32K b2,1M b2" 2>&1 | grep -v Warn | tail -75
