#pragma once
// One include for the common case: contracts, kernels, communicators and the operator.
#include "detlogp/version.hpp"
