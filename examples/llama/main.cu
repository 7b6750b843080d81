// tessera-llama with the CUDA backend: nvcc compiles the same main (host and CUDA nets).
#include "main.cpp"
