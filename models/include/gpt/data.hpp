#pragma once
// GPT-2's tokens: 16 bits (a vocabulary of 50257), read from llm.c's GPT-2
// shards, or bytes of text. The reader, the corpus and its sequences are
// every token model's (trainer_kit/tokens.hpp: the formats, the refusals and
// the sampler are documented there).
#include <cstdint>

#include "trainer_kit/tokens.hpp"

namespace gpt {

using token = std::uint16_t;
using corpus = trainer_kit::corpus<token>;
using trainer_kit::split_sequences;

}  // namespace gpt
