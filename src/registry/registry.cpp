// Contract-aware dispatch: candidate lists, capabilities per platform, the shared instance
// cache and load-failure blacklist, and provenance.

#include "detlogp/registry.hpp"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "contract/contract_json.hpp"
#include "detlogp/version.hpp"
#include "registry/capability_ceiling.hpp"

namespace detlogp {

struct Registry::State {
  std::map<std::string, Backend, std::less<>> catalogue;                    // name -> backend
  std::map<std::string, std::vector<std::string>, std::less<>> candidates;  // platform -> names
  // platform -> name -> capability (shared, so that dispatch copies a pointer, not the sets)
  std::map<std::string,
           std::map<std::string, std::shared_ptr<const BackendCapability>, std::less<>>,
           std::less<>>
      caps;
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> legacy;
  std::map<std::string, std::shared_ptr<LogprobOp>, std::less<>> cache;
  std::set<std::string, std::less<>> failed;
  // Backends whose factory is running (outside the lock), and the thread running it; `built`
  // wakes the threads waiting for one of them.
  std::map<std::string, std::thread::id, std::less<>> building;
  std::condition_variable built;
};

namespace {

std::string strip(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string check_platform(std::string_view platform) {
  for (std::string_view p : kPlatforms) {
    if (p == platform) return std::string(p);
  }
  throw ContractError(ErrorCode::unknown_platform, "platform",
                      fmt::format("unsupported platform '{}'; expected one of [{}]", platform,
                                  fmt::join(kPlatforms, ", ")));
}

void check_backend(const Backend& b) {
  if (strip(b.name).empty() || !b.create) {
    throw ContractError(ErrorCode::empty, "backend",
                        "backend must be a Backend with a non-empty name and a factory");
  }
}

void add_unique(std::vector<std::string>& list, const std::string& name, bool prepend) {
  if (std::find(list.begin(), list.end(), name) != list.end()) return;
  if (prepend) {
    list.insert(list.begin(), name);
  } else {
    list.push_back(name);
  }
}

}  // namespace

Registry::Registry() : state_(std::make_unique<State>()) {
  for (std::string_view p : kPlatforms) state_->candidates[std::string(p)];
}

Registry::~Registry() = default;

// The instance cache, shared by contract and legacy dispatch: created once, a failure is never
// retried. The factory runs without the lock (it may call this registry back); while it runs,
// the name is in `building`, so a second thread asking for the same backend waits for that
// one result instead of building another, and a dispatch from inside the factory itself skips
// the backend (nullptr, nothing recorded) instead of waiting for itself.
std::shared_ptr<LogprobOp> Registry::instance(const std::string& name) {
  State& s = *state_;
  std::unique_lock lock(mutex_);
  for (;;) {
    if (auto it = s.cache.find(name); it != s.cache.end()) return it->second;
    if (s.failed.count(name)) return nullptr;
    auto b = s.building.find(name);
    if (b == s.building.end()) break;
    if (b->second == std::this_thread::get_id()) return nullptr;
    s.built.wait(lock);
  }
  auto it = s.catalogue.find(name);
  if (it == s.catalogue.end()) {
    s.failed.insert(name);
    return nullptr;
  }
  const std::function<std::shared_ptr<LogprobOp>()> create = it->second.create;
  s.building.emplace(name, std::this_thread::get_id());
  lock.unlock();
  std::shared_ptr<LogprobOp> op;
  try {
    op = create();
  } catch (const std::exception&) {
    op = nullptr;
  } catch (...) {  // not a load failure: leave the backend unbuilt and let the caller see it
    lock.lock();
    s.building.erase(name);
    s.built.notify_all();
    throw;
  }
  lock.lock();
  s.building.erase(name);
  s.built.notify_all();
  if (!op) {
    s.failed.insert(name);
    return nullptr;
  }
  s.cache.emplace(name, op);
  return op;
}

void Registry::register_logprob_backend(const Backend& backend,
                                        const std::optional<BackendCapability>& capability,
                                        std::string_view platform, bool prepend) {
  check_backend(backend);
  if (!capability) {
    throw ContractError(
        ErrorCode::empty, "capability",
        "capability must be a BackendCapability (got none) for backend " + backend.name);
  }
  const std::string p = check_platform(platform);
  if (backend.provides) check_within_provided(backend.name, *capability, *backend.provides);
  auto cap = std::make_shared<const BackendCapability>(*capability);
  std::lock_guard lock(mutex_);
  state_->catalogue.insert_or_assign(backend.name, backend);
  state_->caps[p].insert_or_assign(backend.name, std::move(cap));
  add_unique(state_->candidates[p], backend.name, prepend);
}

void Registry::add_contract_candidate(const Backend& backend, std::string_view platform) {
  check_backend(backend);
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  state_->catalogue.insert_or_assign(backend.name, backend);
  add_unique(state_->candidates[p], backend.name, false);
}

void Registry::register_legacy_backend(std::string_view op_type, const Backend& backend,
                                       std::string_view platform, bool prepend) {
  check_backend(backend);
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  state_->catalogue.insert_or_assign(backend.name, backend);
  add_unique(state_->legacy[{std::string(op_type), p}], backend.name, prepend);
}

std::shared_ptr<LogprobOp> Registry::get_op(std::string_view op_type, std::string_view platform) {
  const std::string p = check_platform(platform);
  for (const std::string& name : legacy_priority(op_type, p)) {
    if (auto op = instance(name)) return op;
  }
  throw std::runtime_error(fmt::format("No functional backend found for {} on {}", op_type, p));
}

DispatchResult Registry::get_logprob_op(const LogprobContract& contract,
                                        std::string_view requested_backend,
                                        std::string_view platform) {
  const std::string request = strip(requested_backend);
  if (request.empty()) {
    throw ContractError(ErrorCode::empty, "requested_backend",
                        "requested_backend must be a non-empty string (a policy: auto, "
                        "production, reference; or an exact backend id)");
  }
  const std::string policy = lower(request);
  if (policy == "deterministic") {
    throw ContractError(
        ErrorCode::reserved_name, "requested_backend",
        "requested_backend='deterministic' is not a dispatch policy: determinism is requested "
        "through the contract's ReductionSpec determinism_scope (cross_tp_bitwise or "
        "fixed_topology); use auto, production, reference or an exact backend id");
  }
  const std::string p = check_platform(platform);
  const std::string_view wanted_id = resolve_retired_backend_id(request);

  // A snapshot of the candidates and their capabilities: dispatch then runs without the lock
  // (a factory may call the registry).
  std::vector<std::pair<std::string, std::shared_ptr<const BackendCapability>>> candidates;
  {
    std::lock_guard lock(mutex_);
    const auto& caps = state_->caps[p];
    for (const std::string& name : state_->candidates[p]) {
      auto cap_it = caps.find(name);
      candidates.emplace_back(name, cap_it == caps.end() ? nullptr : cap_it->second);
    }
  }
  std::vector<std::string> rejected;
  int cap_rejections = 0;
  for (const auto& [name, cap_ptr] : candidates) {
    if (!cap_ptr) {
      rejected.push_back(name + ": no LogprobBackendCapability declared");
      ++cap_rejections;
      continue;
    }
    const BackendCapability& cap = *cap_ptr;
    if (policy == "production" || policy == "reference") {
      if (std::string(to_string(cap.implementation_kind())) != policy) {
        rejected.push_back(
            fmt::format("{}: implementation_kind={} does not satisfy "
                        "requested_backend={}",
                        name, to_string(cap.implementation_kind()), policy));
        continue;
      }
    } else if (policy != "auto" && cap.backend_id() != wanted_id) {
      rejected.push_back(fmt::format("{}: backend_id={} does not match requested_backend={}", name,
                                     cap.backend_id(), request));
      continue;
    }
    const std::vector<std::string> reasons = cap.incompatibilities(contract);
    if (!reasons.empty()) {
      rejected.push_back(fmt::format("{}: {}", name, fmt::join(reasons, "; ")));
      ++cap_rejections;
      continue;
    }
    std::shared_ptr<LogprobOp> op = instance(name);
    if (!op) {
      rejected.push_back(name + ": backend could not be loaded or instantiated");
      ++cap_rejections;
      continue;
    }
    DispatchResult r{.op = op,
                     .capability = cap,
                     .requested_backend = request,
                     .actual_backend = cap.backend_id(),
                     .backend_name = name,
                     .platform = p,
                     .fallback = cap_rejections > 0,
                     .prior_rejections = rejected,
                     .provenance_json = {}};
    nlohmann::json j;
    j["requested_backend"] = r.requested_backend;
    j["actual_backend"] = r.actual_backend;
    j["backend_enum"] = r.backend_name;
    j["platform"] = r.platform;
    j["fallback"] = r.fallback;
    j["prior_rejections"] = r.prior_rejections;
    j["contract"] = contract_to_json(contract);
    j["capability"] = capability_to_json(cap);
    j["numerics_version"] = std::string(kNumericsVersion);
    j["kernel"] = op->kernel_name();
    j["library_version"] = std::string(version());
    r.provenance_json = j.dump();
    return r;
  }
  const ShardingSpec& sh = contract.sharding();
  throw std::runtime_error(fmt::format(
      "No logprob backend supports the requested contract on {}: role={}, dtype={}, TP={}, "
      "CP={}, padded_vocab={}, real_vocab={}. Rejections: {}",
      p, to_string(contract.role()), to_string(contract.dtype()), sh.tp_world_size(),
      sh.cp_world_size(), sh.padded_vocab_size(), sh.real_vocab_size(),
      rejected.empty() ? std::string("no candidates registered")
                       : fmt::format("{}", fmt::join(rejected, " | "))));
}

std::vector<std::string> Registry::contract_candidates(std::string_view platform) const {
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  return state_->candidates.at(p);
}

std::vector<std::string> Registry::legacy_priority(std::string_view op_type,
                                                   std::string_view platform) const {
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  auto it = state_->legacy.find({std::string(op_type), p});
  return it == state_->legacy.end() ? std::vector<std::string>{} : it->second;
}

std::optional<BackendCapability> Registry::capability(std::string_view platform,
                                                      std::string_view backend_name) const {
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  auto pit = state_->caps.find(p);
  if (pit == state_->caps.end()) return std::nullopt;
  auto it = pit->second.find(backend_name);
  if (it == pit->second.end()) return std::nullopt;
  return *it->second;
}

std::string_view resolve_retired_backend_id(std::string_view requested_backend) {
  for (const RetiredBackendId& r : kRetiredBackendIds) {
    if (r.retired == requested_backend) return r.current;
  }
  return requested_backend;
}

bool Registry::failed_to_load(std::string_view backend_name) const {
  std::lock_guard lock(mutex_);
  return state_->failed.count(backend_name) > 0;
}

Registry& Registry::global() {
  static const std::unique_ptr<Registry> registry = with_builtin_backends();
  return *registry;
}

DispatchResult get_logprob_op(const LogprobContract& contract, std::string_view requested) {
  return Registry::global().get_logprob_op(contract, requested);
}

void register_logprob_backend(const Backend& backend,
                              const std::optional<BackendCapability>& capability,
                              std::string_view platform, bool prepend) {
  Registry::global().register_logprob_backend(backend, capability, platform, prepend);
}

}  // namespace detlogp
