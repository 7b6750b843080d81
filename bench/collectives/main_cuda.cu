// The same program compiled by nvcc, so it carries the CUDA backend too.
#include "main.cpp"
