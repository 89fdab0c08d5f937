#include "api/plan_store.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "api/internal/sqlite.h"
#include "base/mutex.h"

namespace kc::api {
namespace {

constexpr char kSchema[] = R"(
CREATE TABLE IF NOT EXISTS plans (
  job INTEGER PRIMARY KEY,
  plan_yaml TEXT NOT NULL,
  summary TEXT NOT NULL,
  approval_required INTEGER NOT NULL,
  reasons TEXT NOT NULL,
  decision TEXT NOT NULL,
  decided_by TEXT NOT NULL,
  note TEXT NOT NULL,
  decided_s REAL NOT NULL
);
)";

}  // namespace

struct PlanStore::Impl {
  mutable Mutex mu;
  internal::Database db KC_GUARDED_BY(mu);

  Result<PlanRecord> GetLocked(int64_t job) const KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(
        internal::Statement st,
        db.Prepare("SELECT plan_yaml, summary, approval_required, reasons, "
                   "decision, decided_by, note, decided_s FROM plans WHERE job = ?"));
    st.Bind(1, job);
    const int rc = st.Step();
    if (rc == SQLITE_DONE) return NotFoundError(fmt::format("job {}: no plan (yet)", job));
    if (rc != SQLITE_ROW) return db.Error("cannot read a plan");
    PlanRecord p{.job = job,
                 .plan_yaml = st.Text(0),
                 .summary = st.Text(1),
                 .approval_required = st.Int(2) != 0,
                 .decision = st.Text(4),
                 .decided_by = st.Text(5),
                 .note = st.Text(6),
                 .decided_s = st.Double(7)};
    nlohmann::json reasons = nlohmann::json::parse(st.Text(3), nullptr, false);
    if (reasons.is_array()) {
      for (const auto& r : reasons) {
        if (r.is_string()) p.reasons.push_back(r.get<std::string>());
      }
    }
    return p;
  }

  Status PutLocked(const PlanRecord& p) KC_REQUIRES(mu) {
    KC_ASSIGN_OR_RETURN(internal::Statement st,
                        db.Prepare("INSERT OR REPLACE INTO plans (job, plan_yaml, summary, "
                                   "approval_required, reasons, decision, decided_by, note, "
                                   "decided_s) VALUES (?,?,?,?,?,?,?,?,?)"));
    st.Bind(1, p.job);
    st.Bind(2, p.plan_yaml);
    st.Bind(3, p.summary);
    st.Bind(4, int64_t{p.approval_required ? 1 : 0});
    st.Bind(5, nlohmann::json(p.reasons).dump());
    st.Bind(6, p.decision);
    st.Bind(7, p.decided_by);
    st.Bind(8, p.note);
    st.Bind(9, p.decided_s);
    if (st.Step() != SQLITE_DONE) return db.Error("cannot record a plan");
    return OkStatus();
  }
};

PlanStore::PlanStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanStore::~PlanStore() = default;

Result<std::unique_ptr<PlanStore>> PlanStore::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  MutexLock lock(&impl->mu);
  KC_RETURN_IF_ERROR(impl->db.Open(path, "plan store", kSchema));
  return std::unique_ptr<PlanStore>(new PlanStore(std::move(impl)));
}

Status PlanStore::Put(const PlanRecord& plan) {
  MutexLock lock(&impl_->mu);
  return impl_->PutLocked(plan);
}

Result<PlanRecord> PlanStore::Get(int64_t job) const {
  MutexLock lock(&impl_->mu);
  return impl_->GetLocked(job);
}

Result<PlanRecord> PlanStore::Decide(int64_t job, bool approve, std::string_view admin,
                                     std::string_view note, double now_s) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  KC_ASSIGN_OR_RETURN(PlanRecord p, m.GetLocked(job));
  if (!p.approval_required) {
    return FailedPreconditionError(
        fmt::format("job {}: its plan is within the approval limits; nothing to decide", job));
  }
  if (!p.decision.empty()) {
    return FailedPreconditionError(
        fmt::format("job {}: its plan was {} by {} already", job, p.decision, p.decided_by));
  }
  p.decision = approve ? "approved" : "denied";
  p.decided_by = std::string(admin);
  p.note = std::string(note);
  p.decided_s = now_s;
  KC_RETURN_IF_ERROR(m.PutLocked(p));
  return p;
}

}  // namespace kc::api
