#pragma once
//! \file All policy tags, their concepts and tessera::config.
#include "tessera/policy/averaging.hpp"
#include "tessera/policy/backend.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/policy/outer.hpp"
#include "tessera/policy/precision.hpp"
#include "tessera/policy/reduction.hpp"
#include "tessera/policy/strategy.hpp"
#include "tessera/policy/wrapper.hpp"
