#pragma once
// One include for the common case: contracts, kernels, communicators, the operator and the
// fused lm_head.
#include "detlogp/capability.hpp"
#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/drift.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/fused.hpp"
#include "detlogp/fused_dispatch.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/sampler.hpp"
#include "detlogp/version.hpp"
#include "detlogp/views.hpp"
