#include "trainer_adapter/batch_client.h"

#include <algorithm>

namespace weft::trainer_adapter {

double StalenessStats::mean_lag() const {
  uint64_t sum = 0;
  for (const auto& [lag, count] : lag_histogram) sum += lag * count;
  return groups == 0 ? 0.0 : static_cast<double>(sum) / static_cast<double>(groups);
}

Result<std::vector<TrajectoryGroup>> BatchClient::NextBatch(size_t samples,
                                                            uint64_t trainer_version,
                                                            std::chrono::milliseconds wait) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + wait;
  std::vector<TrajectoryGroup> groups;
  size_t held = 0;
  while (held < samples) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    // Groups to ask for: the samples still wanted over the mean group size seen so far (one group
    // while none has been seen), so a batch does not overshoot by many groups.
    const size_t group =
        stats_.groups > 0 ? std::max<uint64_t>(1, stats_.samples / stats_.groups) : samples;
    const uint32_t ask =
        static_cast<uint32_t>(std::clamp<size_t>((samples - held + group - 1) / group, 1, 100000));
    WEFT_ASSIGN_OR_RETURN(std::vector<orchestrator::ReceivedTrajectory> batch,
                          client_.TakeBatch(ask, left));
    for (orchestrator::ReceivedTrajectory& t : batch) {
      TrajectoryGroup g;
      static_cast<orchestrator::ReceivedTrajectory&>(g) = std::move(t);
      orchestrator::Submission& s = g.submission;
      g.lag = trainer_version > s.version_start ? trainer_version - s.version_start : 0;
      g.trajectories = nlohmann::json::parse(s.payload, nullptr, false);
      if (g.trajectories.is_discarded()) {
        return DataLoss("job " + std::to_string(s.job) +
                        ": the trajectories delivered are not JSON");
      }
      s.payload = std::string();  // parsed: the text is not kept
      ++stats_.groups;
      stats_.samples += g.samples();
      ++stats_.lag_histogram[g.lag];
      stats_.max_lag = std::max(stats_.max_lag, g.lag);
      if (g.stale) {
        ++stats_.stale_delivered;
      } else if (g.lag > max_staleness_) {
        ++stats_.violations;
      }
      held += g.samples();
      groups.push_back(std::move(g));
    }
    if (Clock::now() >= deadline) break;
  }
  return groups;
}

}  // namespace weft::trainer_adapter
