#include "trainer_adapter/received_group.h"

#include "common/json_fields.h"
#include "orchestrator/wire.h"
#include "trainer_adapter/batch_client.h"

namespace weft::trainer_adapter {

Result<ReceivedGroup> ParseGroup(const orchestrator::Delivered& delivered,
                                 uint64_t trainer_version) {
  const orchestrator::TrajectoryGroup& g = delivered.group;
  const std::string where = "job " + std::to_string(g.job);
  WEFT_ASSIGN_OR_RETURN(orchestrator::wire::Trajectories body,
                        orchestrator::wire::DecodeTrajectories(g.trajectories, where));
  ReceivedGroup out;
  out.job = g.job;
  out.attempt = g.attempt;
  out.cluster = g.cluster;
  out.prompt = std::move(body.prompt);
  if (!delivered.metadata.empty()) {
    WEFT_ASSIGN_OR_RETURN(out.metadata, ParseStrict(delivered.metadata, where + ": the metadata"));
  }
  out.version_start = g.version_start;
  out.version_end = g.version_end;
  out.segments = g.segments;
  out.stale = delivered.stale;
  out.lag = delivered.model.empty() ? LagOf(g, trainer_version) : 0;  // a fixed model: no lag
  // The group's segments count the samples' tokens end to end.
  bool ordered =
      !g.segments.empty() && g.segments.front().second == 0 && g.segments.back().second <= g.tokens;
  for (size_t i = 1; ordered && i < g.segments.size(); ++i)
    ordered = g.segments[i - 1].second <= g.segments[i].second;
  if (!ordered) {
    return InvalidArgument(where + ": the group's segments do not cover its " +
                           std::to_string(g.tokens) + " tokens");
  }
  uint64_t offset = 0;
  size_t segment = 0;
  for (orchestrator::wire::TrajectorySample& s : body.samples) {
    ReceivedSample sample;
    sample.versions.reserve(s.tokens.size());
    for (size_t t = 0; t < s.tokens.size(); ++t, ++offset) {
      while (segment + 1 < g.segments.size() && g.segments[segment + 1].second <= offset) ++segment;
      sample.versions.push_back(g.segments[segment].first);
    }
    sample.tokens = std::move(s.tokens);
    sample.logprobs = std::move(s.logprobs);
    sample.reward = s.reward;
    sample.text = std::move(s.text);
    sample.extra = std::move(s.extra);
    if (!s.segments.empty()) sample.extra["segments"] = s.segments;
    out.samples.push_back(std::move(sample));
  }
  if (offset != g.tokens) {
    return InvalidArgument(where + ": the samples hold " + std::to_string(offset) +
                           " tokens, the group says " + std::to_string(g.tokens));
  }
  return out;
}

}  // namespace weft::trainer_adapter
