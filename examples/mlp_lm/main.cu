// nvcc builds the trainer with both backends from the same source.
#include "main.cpp"
