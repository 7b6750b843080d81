#pragma once
//! \file Sharded checkpoints: save and load a wrapper's main weights and its
//! ShardedOptimizer's state, on either backend, into and from any world size
//! and strategy.
//!
//! Layout under a root directory:
//!   ROOT/step-000001200/rank-00002-of-00004.safetensors   each rank's pieces
//!   ROOT/step-000001200/index.json                        written last
//! Rank r writes the part of every tensor that lies in its shard of the flat
//! unit layout (shard = 1/N of the padded unit, whatever the strategy), for
//! the main weights and each optimizer state, as 1-D safetensors entries
//! "unit.tensor/state". The index says which elements each entry holds.
//!
//! Atomic: everything is written into ROOT/.tmp-step-..., each file synced,
//! the index written (synced) last, then the directory renamed into place and
//! ROOT synced; a crash or a full disk at any point leaves earlier
//! checkpoints as they were and no step-* directory without an index.
//!
//! Verified: a load checks the index, each file's size and safetensors
//! header against the index, the checksum of every byte range it reads, and
//! the model's tensors, shapes and dtypes against the index; each rank reads
//! only the pieces overlapping its own optimizer range, all ranks agree that
//! every check passed, and only then is the model touched.
//!
//! Save and load are collective over the wrapper's communicator; the ranks
//! must see one shared file system.
#include "tessera/checkpoint/load.hpp"
#include "tessera/checkpoint/save.hpp"
#include "tessera/optim/sharded_optimizer.hpp"
