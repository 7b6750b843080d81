// nvcc builds the exact instantiations with both backends (see exact.cpp).
#include "exact.cpp"
