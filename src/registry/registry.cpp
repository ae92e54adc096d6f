// Contract-aware dispatch for every op kind: candidate lists and capabilities per (kind,
// platform), the shared instance cache and load-failure blacklist, and provenance.

#include "detlogp/registry.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <condition_variable>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "contract/contract_json.hpp"
#include "detlogp/version.hpp"
#include "registry/capability_ceiling.hpp"

namespace detlogp {

// A built backend's op: exactly one pointer is set, the one of its entry's kind.
struct Registry::Instance {
  std::shared_ptr<LogprobOp> logits;
  std::shared_ptr<const FusedLinearLogprob> fused;

  explicit operator bool() const { return logits || fused; }
  // The pointer of op type `Op` (LogprobOp or const FusedLinearLogprob).
  template <class Op>
  std::shared_ptr<Op>& as() {
    if constexpr (std::is_same_v<Op, LogprobOp>) {
      return logits;
    } else {
      return fused;
    }
  }
};

// A registered backend of either kind; its factory returns an Instance.
struct Registry::Entry {
  OpKind kind;
  std::function<Instance()> create;
  std::optional<BackendCapability> provides;
  std::string name;
};

struct Registry::State {
  // One op kind's contract dispatch: platform -> candidate names, and platform -> name ->
  // capability (shared, so that dispatch copies a pointer, not the sets).
  struct Kind {
    std::map<std::string, std::vector<std::string>, std::less<>> candidates;
    std::map<std::string,
             std::map<std::string, std::shared_ptr<const BackendCapability>, std::less<>>,
             std::less<>>
        caps;
  };
  Kind& of(OpKind kind) { return kinds[static_cast<std::size_t>(kind)]; }

  std::map<std::string, Entry, std::less<>> catalogue;  // name -> backend, names unique
  std::array<Kind, kOpKinds.size()> kinds;
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> legacy;
  std::map<std::string, Instance, std::less<>> cache;
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

template <class Op>
void check_backend(const BasicBackend<Op>& b) {
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

// The catalogue entry of a backend of either kind: the factory's op wrapped in an Instance.
template <class Op>
Registry::Entry entry_of(const BasicBackend<Op>& b) {
  check_backend(b);
  return Registry::Entry{
      .kind = std::is_same_v<Op, LogprobOp> ? OpKind::logits : OpKind::fused_linear,
      .create =
          [create = b.create] {
            Registry::Instance i;
            i.as<Op>() = create();
            return i;
          },
      .provides = b.provides,
      .name = b.name};
}

// Adds or replaces a catalogue entry; a name belongs to one op kind for the registry's life.
void put_entry(std::map<std::string, Registry::Entry, std::less<>>& catalogue,
               const Registry::Entry& entry) {
  if (auto it = catalogue.find(entry.name);
      it != catalogue.end() && it->second.kind != entry.kind) {
    throw ContractError(ErrorCode::duplicate, "backend",
                        fmt::format("backend name {} is already registered as a {} backend; "
                                    "register the {} backend under another name",
                                    entry.name, to_string(it->second.kind), to_string(entry.kind)));
  }
  catalogue.insert_or_assign(entry.name, entry);
}

}  // namespace

Registry::Registry() : state_(std::make_unique<State>()) {
  for (OpKind k : kOpKinds) {
    for (std::string_view p : kPlatforms) state_->of(k).candidates[std::string(p)];
  }
}

Registry::~Registry() = default;

// The instance cache, shared by contract and legacy dispatch: created once, a failure is never
// retried. The factory runs without the lock (it may call this registry back); while it runs,
// the name is in `building`, so a second thread asking for the same backend waits for that
// one result instead of building another, and a dispatch from inside the factory itself skips
// the backend (nullptr, nothing recorded) instead of waiting for itself.
Registry::Instance Registry::instance(const std::string& name) {
  State& s = *state_;
  std::unique_lock lock(mutex_);
  for (;;) {
    if (auto it = s.cache.find(name); it != s.cache.end()) return it->second;
    if (s.failed.count(name)) return {};
    auto b = s.building.find(name);
    if (b == s.building.end()) break;
    if (b->second == std::this_thread::get_id()) return {};
    s.built.wait(lock);
  }
  auto it = s.catalogue.find(name);
  if (it == s.catalogue.end()) {
    s.failed.insert(name);
    return {};
  }
  const std::function<Instance()> create = it->second.create;
  s.building.emplace(name, std::this_thread::get_id());
  lock.unlock();
  Instance op;
  try {
    op = create();
  } catch (const std::exception&) {
    op = {};
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
    return {};
  }
  s.cache.emplace(name, op);
  return op;
}

void Registry::register_backend(OpKind kind, const Entry& entry,
                                const std::optional<BackendCapability>& capability,
                                std::string_view platform, bool prepend) {
  if (!capability) {
    throw ContractError(
        ErrorCode::empty, "capability",
        "capability must be a BackendCapability (got none) for backend " + entry.name);
  }
  const std::string p = check_platform(platform);
  if (entry.provides) check_within_provided(entry.name, *capability, *entry.provides);
  auto cap = std::make_shared<const BackendCapability>(*capability);
  std::lock_guard lock(mutex_);
  put_entry(state_->catalogue, entry);
  State::Kind& k = state_->of(kind);
  k.caps[p].insert_or_assign(entry.name, std::move(cap));
  add_unique(k.candidates[p], entry.name, prepend);
}

void Registry::register_logprob_backend(const Backend& backend,
                                        const std::optional<BackendCapability>& capability,
                                        std::string_view platform, bool prepend) {
  register_backend(OpKind::logits, entry_of(backend), capability, platform, prepend);
}

void Registry::register_fused_backend(const FusedBackend& backend,
                                      const std::optional<BackendCapability>& capability,
                                      std::string_view platform, bool prepend) {
  register_backend(OpKind::fused_linear, entry_of(backend), capability, platform, prepend);
}

void Registry::add_contract_candidate(const Backend& backend, std::string_view platform) {
  const Entry entry = entry_of(backend);
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  put_entry(state_->catalogue, entry);
  add_unique(state_->of(OpKind::logits).candidates[p], backend.name, false);
}

void Registry::register_legacy_backend(std::string_view op_type, const Backend& backend,
                                       std::string_view platform, bool prepend) {
  const Entry entry = entry_of(backend);
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  put_entry(state_->catalogue, entry);
  add_unique(state_->legacy[{std::string(op_type), p}], backend.name, prepend);
}

std::shared_ptr<LogprobOp> Registry::get_op(std::string_view op_type, std::string_view platform) {
  const std::string p = check_platform(platform);
  for (const std::string& name : legacy_priority(op_type, p)) {
    if (auto op = instance(name).logits) return op;
  }
  throw std::runtime_error(fmt::format("No functional backend found for {} on {}", op_type, p));
}

DispatchResult Registry::get_logprob_op(const LogprobContract& contract,
                                        std::string_view requested_backend,
                                        std::string_view platform) {
  return dispatch<LogprobOp>(OpKind::logits, contract, requested_backend, platform);
}

FusedDispatchResult Registry::get_fused_linear_logprob_op(const LogprobContract& contract,
                                                          std::string_view requested_backend,
                                                          std::string_view platform) {
  return dispatch<const FusedLinearLogprob>(OpKind::fused_linear, contract, requested_backend,
                                            platform);
}

template <class Op>
BasicDispatchResult<Op> Registry::dispatch(OpKind kind, const LogprobContract& contract,
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
    State::Kind& k = state_->of(kind);
    const auto& caps = k.caps[p];
    for (const std::string& name : k.candidates[p]) {
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
    Instance built = instance(name);
    std::shared_ptr<Op> op = built.template as<Op>();
    if (!op) {
      rejected.push_back(name + ": backend could not be loaded or instantiated");
      ++cap_rejections;
      continue;
    }
    BasicDispatchResult<Op> r{.op = op,
                              .capability = cap,
                              .requested_backend = request,
                              .actual_backend = cap.backend_id(),
                              .backend_name = name,
                              .platform = p,
                              .fallback = cap_rejections > 0,
                              .prior_rejections = rejected,
                              .provenance_json = {}};
    nlohmann::json j;
    j["op_kind"] = to_string(kind);
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
  throw std::runtime_error(
      fmt::format("No {} backend supports the requested contract on {}: role={}, dtype={}, TP={}, "
                  "CP={}, padded_vocab={}, real_vocab={}. Rejections: {}",
                  kind == OpKind::logits ? "logprob" : "fused lm_head", p,
                  to_string(contract.role()), to_string(contract.dtype()), sh.tp_world_size(),
                  sh.cp_world_size(), sh.padded_vocab_size(), sh.real_vocab_size(),
                  rejected.empty() ? std::string("no candidates registered")
                                   : fmt::format("{}", fmt::join(rejected, " | "))));
}

std::vector<std::string> Registry::contract_candidates(std::string_view platform,
                                                       OpKind kind) const {
  const std::string p = check_platform(platform);
  std::lock_guard lock(mutex_);
  return state_->of(kind).candidates.at(p);
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
  auto entry = state_->catalogue.find(backend_name);
  if (entry == state_->catalogue.end()) return std::nullopt;
  const auto& caps = state_->of(entry->second.kind).caps;
  auto pit = caps.find(p);
  if (pit == caps.end()) return std::nullopt;
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
