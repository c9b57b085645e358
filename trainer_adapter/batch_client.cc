#include "trainer_adapter/batch_client.h"

#include <algorithm>

#include "common/json_text.h"

namespace weft::trainer_adapter {

size_t SampleCount(const orchestrator::TrajectoryGroup& group) {
  // The orchestrator checked that the text is JSON when the worker submitted it, and the client
  // when it arrived: it is only measured here.
  const std::string_view text = group.trajectories;
  std::optional<std::string_view> samples = json_text::Member(text, 0, "samples");
  if (!samples || samples->empty() || samples->front() != '[') return 1;
  return json_text::Elements(*samples, 0).size();
}

double StalenessStats::mean_lag() const {
  uint64_t sum = 0;
  for (const auto& [lag, count] : lag_histogram) sum += lag * count;
  return groups == 0 ? 0.0 : static_cast<double>(sum) / static_cast<double>(groups);
}

Result<std::vector<orchestrator::Delivered>> BatchClient::NextBatch(
    size_t samples, uint64_t trainer_version, std::chrono::milliseconds wait) {
  return Take(samples, true, trainer_version, wait);
}

Result<std::vector<orchestrator::Delivered>> BatchClient::NextGroups(
    size_t groups, uint64_t trainer_version, std::chrono::milliseconds wait) {
  return Take(groups, false, trainer_version, wait);
}

Result<std::vector<orchestrator::Delivered>> BatchClient::Take(size_t want, bool in_samples,
                                                               uint64_t trainer_version,
                                                               std::chrono::milliseconds wait) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + wait;
  // The trainer waited for this call's data as long as it took: reported with the next request.
  struct Report {
    orchestrator::OrchestratorClient& client;
    Clock::time_point start;
    ~Report() { client.ReportWait(std::chrono::duration<double>(Clock::now() - start).count()); }
  } report{client_, start};
  std::vector<orchestrator::Delivered> groups;
  size_t held = 0;
  while (held < want) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    // Groups to ask for: the units still wanted, over the mean group size seen so far when
    // counting samples (one group while none has been seen), so a batch does not overshoot by
    // many groups.
    const size_t group = !in_samples         ? 1
                         : stats_.groups > 0 ? std::max<uint64_t>(1, stats_.samples / stats_.groups)
                                             : want;
    const uint32_t ask =
        static_cast<uint32_t>(std::clamp<size_t>((want - held + group - 1) / group, 1, 100000));
    Result<std::vector<orchestrator::Delivered>> taken = client_.TakeBatch(ask, left);
    if (!taken.ok()) {
      // Groups already received are returned, not dropped: the client has taken their batches,
      // so its next request acknowledges them. The error shows again at the next call if it
      // lasts.
      if (!groups.empty()) break;
      return taken.status();
    }
    for (orchestrator::Delivered& d : *taken) {
      const size_t count = SampleCount(d.group);
      ++stats_.groups;
      stats_.samples += count;
      held += in_samples ? count : 1;
      if (!d.model.empty()) {
        // A fixed model's group (a teacher's scores): its versions are its own, and no lag.
        groups.push_back(std::move(d));
        continue;
      }
      const uint64_t lag = LagOf(d.group, trainer_version);
      ++stats_.lag_histogram[lag];
      stats_.max_lag = std::max(stats_.max_lag, lag);
      if (d.stale) {
        ++stats_.stale_delivered;
      } else if (lag > max_staleness_) {
        ++stats_.violations;
      }
      groups.push_back(std::move(d));
    }
    if (Clock::now() >= deadline) break;
  }
  return groups;
}

}  // namespace weft::trainer_adapter
