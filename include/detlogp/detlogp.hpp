#pragma once
// One include for the common case: contracts, kernels, communicators and the operator.
#include "detlogp/capability.hpp"
#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/drift.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "detlogp/version.hpp"
