#include "orchestrator/wire.h"
#include "tests/source_dir.h"

#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>

namespace weft::orchestrator::wire {
namespace {

using Json = nlohmann::json;

TrajectoryGroup Group(std::string trajectories) {
  TrajectoryGroup g;
  g.job = 7;
  g.attempt = 2;
  g.cluster = "eu-1";
  g.version_start = 3;
  g.version_end = 4;
  g.segments = {{3, 0}, {4, 5}, {3, 9}};
  g.tokens = 12;
  g.trajectories = std::move(trajectories);
  return g;
}

void CheckSameFields(const TrajectoryGroup& a, const TrajectoryGroup& b) {
  CHECK(a.job == b.job);
  CHECK(a.attempt == b.attempt);
  CHECK(a.cluster == b.cluster);
  CHECK(a.version_start == b.version_start);
  CHECK(a.version_end == b.version_end);
  CHECK(a.segments == b.segments);
  CHECK(a.tokens == b.tokens);
}

TEST_CASE("wire: a submission's samples travel as the text the worker sent, byte for byte") {
  // White space, key order, number spellings and a nested "trajectories" key all survive.
  const std::string samples =
      "{ \"samples\" : [ {\"tokens\":[1, 2], \"reward\": 1.0E0} ],\n"
      "  \"prompt\": \"12+\\u0033=\", \"meta\": {\"trajectories\": [null]} }";
  const std::string body = EncodeSubmission(Group(samples));
  CHECK(Json::parse(body)["trajectories"] == Json::parse(samples));
  Result<TrajectoryGroup> decoded = DecodeSubmission(body);
  REQUIRE_MESSAGE(decoded.ok(), decoded.status().ToString());
  CheckSameFields(*decoded, Group(samples));
  CHECK(decoded->trajectories == samples);
  // Any JSON value, in any position among the fields, with a key spelled with escapes.
  for (const std::string& text : {std::string("null"), std::string("\"x\""), std::string("[1,[2]]"),
                                  std::string("-0.5e-3"), std::string("{}")}) {
    Json fields = GroupFields(Group(""));
    std::string reordered = "{\"tr\\u0061jectories\" : " + text + " ," + fields.dump().substr(1);
    Result<TrajectoryGroup> g = DecodeSubmission(reordered);
    REQUIRE_MESSAGE(g.ok(), g.status().ToString());
    CHECK(g->trajectories == text);
  }
  // A key given twice is an error, wherever it is (parsers disagree on which value counts).
  Json fields = GroupFields(Group(""));
  std::string twice = "{\"trajectories\": 1, " + fields.dump().substr(1);
  twice.pop_back();
  twice += ", \"trajectories\": [2]}";
  CHECK(DecodeSubmission(twice).status().message().find("a key repeated in one object") !=
        std::string::npos);
  std::string inner = fields.dump();
  inner.pop_back();
  inner += R"(,"trajectories":[{"a":1,"b":2,"a":3}]})";
  CHECK(DecodeSubmission(inner).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("wire: names, versions and nesting are bounded") {
  CHECK(DecodeRegistration(R"({"cluster":"a\"b","region":"eu","capacity":1})")
            .status()
            .message()
            .find("cluster.cluster 'a\"b' has a character outside") != std::string::npos);
  CHECK(DecodeRegistration(R"({"cluster":"a","region":"eu\nx","capacity":1})").status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(DecodeRegistration(R"({"cluster":"a-1","region":"eu","capacity":1})").ok());
  CHECK(DecodeAnnouncement(R"({"version":9007199254740991})").value() == kMaxVersion);
  CHECK(DecodeAnnouncement(R"({"version":9007199254740992})").status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(DecodeAnnouncement(R"({"version":18446744073709551615})").status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(DecodeHeartbeat(R"({"ready_version":9007199254740992})").status().code() ==
        StatusCode::kInvalidArgument);
  Json body = GroupFields(Group(""));
  body["version_end"] = kMaxVersion + 1;
  body["trajectories"] = Json::array();
  CHECK(DecodeSubmission(body.dump()).status().message().find("version_end must be") !=
        std::string::npos);
  // Deep nesting is refused before any tree is built.
  body = GroupFields(Group(""));
  std::string deep = body.dump();
  deep.pop_back();
  deep += ",\"trajectories\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(DecodeSubmission(deep).status().message().find("nested more than 64 deep") !=
        std::string::npos);
}

TEST_CASE("wire: requests are decoded strictly; errors name the field") {
  CHECK(DecodeSubmission("{").status().message() ==
        "the request body is not valid JSON: byte 1: expected a string key");
  CHECK(DecodeSubmission("[1]").status().message() == "the request body is not a JSON object");
  Json body = GroupFields(Group(""));
  CHECK(DecodeSubmission(body.dump()).status().message() ==
        "submission lacks the field 'trajectories'");
  body["trajectories"] = {1};
  body["extra"] = 1;
  CHECK(DecodeSubmission(body.dump()).status().message() ==
        "submission has an unknown field 'extra'");
  body.erase("extra");
  body["segments"] = {{1, 2}, {3}};
  CHECK(DecodeSubmission(body.dump()).status().message() ==
        "submission.segments[1] is not a [version, first_token] pair");
  body["segments"] = Json::array();
  CHECK(DecodeSubmission(body.dump()).status().code() == StatusCode::kInvalidArgument);
  body["segments"] = {{1, 0}};
  body["attempt"] = -1;
  CHECK(DecodeSubmission(body.dump()).status().message() ==
        "submission.attempt is not a non-negative integer");

  CHECK(DecodeRegistration(R"({"cluster": "c", "region": "r"})").status().message() ==
        "cluster lacks the field 'capacity'");
  CHECK(
      DecodeRegistration(R"({"cluster": "c", "region": "r", "capacity": 0})").status().message() ==
      "cluster.capacity must be 1 to 1000000");
  CHECK(DecodeLeaseRequest(R"({"max": 0})").status().message() == "leases.max must be 1 to 100000");
  CHECK(DecodeBatchRequest(R"({"ack": "x"})").status().message() ==
        "batches.ack is not a batch id or null");
  CHECK(DecodeDrain(R"({"jobs": [1, "2"]})").status().message() ==
        "drain.jobs holds something that is not a job id");
  CHECK(DecodeJobs(R"({"prompts": [{"prompt": "a", "samples": 5000}]})").status().message() ==
        "jobs.prompts[0].samples must be 1 to 4096");
  CHECK(DecodeHeartbeat(R"({"ready_version": 1, "sync": {"digest": "XYZ"}})").status().message() ==
        "heartbeat.sync.digest is not a hex digest of at most 64 digits");
  CHECK(DecodeAnnouncement(R"({"version": -3})").status().message() ==
        "version.version is not a non-negative integer");
}

TEST_CASE("wire: every request and answer survives a round trip") {
  Result<Registration> r = DecodeRegistration(Encode(Registration{"c1", "eu", 8}));
  REQUIRE(r.ok());
  CHECK(r->cluster == "c1");
  CHECK(r->region == "eu");
  CHECK(r->capacity == 8);

  SyncReport sync;
  sync.bytes_downloaded = 123;
  sync.pulls = 4;
  sync.keyframe_pulls = 1;
  sync.digest_mismatches = 2;
  sync.commits = 3;
  sync.max_pause_ms = 0.25;
  sync.engine_replicas = 2;
  sync.ready_replicas = 1;
  sync.first_version = 0;
  sync.newest_version = 9;
  sync.digest = "00ff";
  Result<Heartbeat> h = DecodeHeartbeat(Encode(Heartbeat{5, sync}));
  REQUIRE(h.ok());
  CHECK(h->ready_version == 5);
  REQUIRE(h->sync.has_value());
  CHECK(SyncReportJson(*h->sync) == SyncReportJson(sync));
  CHECK(!DecodeHeartbeat(Encode(Heartbeat{})).value().ready_version.has_value());

  Result<LeaseRequest> lr =
      DecodeLeaseRequest(Encode(LeaseRequest{3, std::chrono::milliseconds(250), 77}));
  REQUIRE(lr.ok());
  CHECK(lr->max == 3);
  CHECK(lr->wait.count() == 250);
  CHECK(lr->request == 77);

  LeaseAnswer leases{{{1, 1, 1000, 4, "\"1+1=\"", 8}, {2, 3, 2000, 5, "[1,2]", 1}}, 9};
  Result<LeaseAnswer> answer = DecodeLeases(EncodeLeases(leases));
  REQUIRE(answer.ok());
  CHECK(answer->latest_version == 9u);
  const std::vector<Lease>* back = &answer->leases;
  REQUIRE(back->size() == 2);
  CHECK((*back)[1].prompt == "[1,2]");
  CHECK((*back)[1].attempt == 3);
  CHECK((*back)[0].deadline == 1000);
  CHECK((*back)[0].samples == 8);
  // No version announced yet: no field, and none read back.
  CHECK(EncodeLeases({}) == R"({"leases":[]})");
  CHECK(!DecodeLeases(R"({"leases":[]})").value().latest_version);

  CHECK(DecodeDrain(EncodeDrain({4, 5})).value() == std::vector<uint64_t>{4, 5});
  CHECK(DecodeDrain("{}").value().empty());
  CHECK(DecodeSubmitResult(Encode(SubmitResult::kDuplicate)).value() == SubmitResult::kDuplicate);
  CHECK(DecodeAnnouncement(EncodeAnnouncement(12)).value() == 12);
  std::optional<double> publish_seconds;
  CHECK(DecodeAnnouncement(EncodeAnnouncement(13, 0.25), &publish_seconds).value() == 13);
  CHECK(publish_seconds == 0.25);
  CHECK(DecodeAnnouncement(R"({"version":1,"publish_seconds":null})", &publish_seconds).ok());
  CHECK(!publish_seconds);
  CHECK(DecodeAnnouncement(R"({"version":1,"publish_seconds":-1})").status().message() ==
        "announcement.publish_seconds is not a non-negative number of seconds");
  Result<std::vector<JobSpec>> jobs = DecodeJobs(EncodeJobs({{"\"a\"", 2}, {"[1, 2]", 1}}));
  REQUIRE(jobs.ok());
  CHECK((*jobs)[0].prompt == "\"a\"");
  CHECK((*jobs)[0].samples == 2);
  CHECK((*jobs)[1].prompt == "[1,2]");  // kept as the parser prints it
  CHECK(DecodeJobIds(EncodeJobIds({9, 10})).value() == std::vector<uint64_t>{9, 10});

  Result<BatchRequest> br =
      DecodeBatchRequest(Encode(BatchRequest{0, std::chrono::seconds(3), 6, std::nullopt}));
  REQUIRE(br.ok());
  CHECK(br->max == 0);
  CHECK(br->wait.count() == 0);  // an acknowledgement does not wait
  CHECK(br->ack == 6);
  CHECK(!br->waited_seconds);
  br = DecodeBatchRequest(Encode(BatchRequest{4, std::chrono::seconds(1), std::nullopt, 1.5}));
  REQUIRE(br.ok());
  CHECK(br->waited_seconds == 1.5);
  CHECK(DecodeBatchRequest(R"({"max":1,"waited_seconds":"soon"})").status().message() ==
        "batches.waited_seconds is not a non-negative number of seconds");
}

TEST_CASE("wire: a batch hands every group its own samples, as they were submitted") {
  Batch batch;
  batch.id = 5;
  batch.redelivered = true;
  batch.latest_version = 9;
  const std::vector<std::string> samples = {"{\"samples\": [1, 2]}", "[]", "\"trajectories\"",
                                            "{\"trajectories\": {\"trajectories\": 1}}"};
  for (size_t i = 0; i < samples.size(); ++i) {
    batch.items.push_back({Group(samples[i]), i % 2 == 1});
    batch.items.back().group.job = i + 1;
  }
  const std::string text = Encode(batch);
  CHECK(Json::parse(text)["trajectories"][3]["trajectories"] == Json::parse(samples[3]));
  Result<Batch> decoded = DecodeBatch(text);
  REQUIRE_MESSAGE(decoded.ok(), decoded.status().ToString());
  CHECK(decoded->id == 5);
  CHECK(decoded->redelivered);
  CHECK(decoded->latest_version == 9);
  REQUIRE(decoded->items.size() == samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    CHECK(decoded->items[i].group.job == i + 1);
    CHECK(decoded->items[i].stale == (i % 2 == 1));
    CHECK(decoded->items[i].group.trajectories == samples[i]);
  }
  // Nothing to hand out.
  Result<Batch> empty = DecodeBatch(Encode(Batch{}));
  REQUIRE(empty.ok());
  CHECK(empty->id == 0);
  CHECK(empty->items.empty());
  CHECK(!empty->latest_version.has_value());
  // Answers that are not what the API promises.
  CHECK(DecodeBatch("{\"batch\": 1}").status().message() == "the answer lacks 'trajectories'");
  CHECK(DecodeBatch("{\"batch\": 1, \"trajectories\": [{\"job\": 1}]}").status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(DecodeBatch("not json").status().message() ==
        "the answer is not valid JSON: byte 0: not a JSON value");
}

TEST_CASE("wire: a job's metadata travels as the text the trainer sent; null or absent is none") {
  // White space, key order, number spellings, escapes and a nested "metadata" key all survive.
  const std::string metadata =
      "{ \"row\" : 17,\n \"answer\": 1.0E0, \"note\": \"\\u00e9\", \"metadata\": [null] }";
  const std::string body =
      "\xEF\xBB\xBF { \"prompts\" : [ {\"prompt\": \"a\", \"metadata\" : " + metadata +
      " }, {\"metadata\": null, \"prompt\": [1, 2]}, {\"prompt\": \"b\"},"
      " {\"metadata\":\"x\",\"samples\":3,\"prompt\":\"c\"} ] }";
  Result<std::vector<JobSpec>> jobs = DecodeJobs(body);
  REQUIRE_MESSAGE(jobs.ok(), jobs.status().ToString());
  REQUIRE(jobs->size() == 4);
  CHECK((*jobs)[0].metadata == metadata);
  CHECK((*jobs)[0].prompt == "\"a\"");
  CHECK((*jobs)[1].metadata.empty());
  CHECK((*jobs)[1].prompt == "[1,2]");
  CHECK((*jobs)[2].metadata.empty());
  CHECK((*jobs)[3].metadata == "\"x\"");
  CHECK((*jobs)[3].samples == 3);
  // And back: the encoded request carries each job's metadata as it is.
  Result<std::vector<JobSpec>> again = DecodeJobs(EncodeJobs(*jobs));
  REQUIRE_MESSAGE(again.ok(), again.status().ToString());
  for (size_t i = 0; i < jobs->size(); ++i) {
    CHECK((*again)[i].prompt == (*jobs)[i].prompt);
    CHECK((*again)[i].samples == (*jobs)[i].samples);
    CHECK((*again)[i].metadata == (*jobs)[i].metadata);
  }
  CHECK(Json::parse(EncodeJobs(*jobs))["prompts"][0]["metadata"]["row"] == 17);
  CHECK(!Json::parse(EncodeJobs(*jobs))["prompts"][2].contains("metadata"));
}

TEST_CASE("wire: a job's metadata is bounded; errors name the job") {
  // 64 KiB of text is taken, one byte more is not.
  const std::string most = "\"" + std::string(kMaxJobMetadataBytes - 2, 'm') + "\"";
  const std::string body = R"({"prompts": [{"prompt": "a"}, {"prompt": "b", "metadata": )";
  Result<std::vector<JobSpec>> jobs = DecodeJobs(body + most + "}]}");
  REQUIRE_MESSAGE(jobs.ok(), jobs.status().ToString());
  CHECK((*jobs)[1].metadata == most);
  CHECK(DecodeJobs(body + "[" + most + "]}]}").status().message() ==
        "jobs.prompts[1].metadata is 65538 bytes of JSON text; at most 65536 (64 KiB)");
  // Not JSON, or a key repeated within it: the whole body is refused, saying where.
  CHECK(DecodeJobs(body + "{\"a\": tru}}]}")
            .status()
            .message()
            .find("the request body is not valid JSON: byte ") == 0);
  CHECK(DecodeJobs(body + "{\"a\": 1, \"a\": 2}}]}").status().message().find("a key repeated") !=
        std::string::npos);
  // Only "metadata" is cut out of the jobs: other members are still unknown fields.
  CHECK(DecodeJobs(R"({"prompts": [{"prompt": "a", "trajectories": 1}]})").status().message() ==
        "jobs.prompts[0] has an unknown field 'trajectories'");
  CHECK(DecodeJobs(R"({"prompts": [{"metadata": 1}]})").status().message() ==
        "jobs.prompts[0] lacks the field 'prompt'");
  CHECK(DecodeJobs(R"({"prompts": [], "metadata": 1})").status().message() ==
        "jobs has an unknown field 'metadata'");
  // What the journal and snapshots give back is checked the same way.
  CHECK(CheckMetadata(most, "m").ok());
  CHECK(CheckMetadata("[" + most + "]", "m").message() ==
        "m is 65538 bytes of JSON text; at most 65536 (64 KiB)");
  CHECK(CheckMetadata("{\"a\":", "m").message().find("m is not valid JSON: byte ") == 0);
  CHECK(CheckMetadata("", "m").code() == StatusCode::kInvalidArgument);
  CHECK(CheckMetadata("\xEF\xBB\xBF"
                      "1",
                      "m")
            .message() == "m starts with a byte order mark");
  // As deep as a jobs body lets it be (61 levels under the body's 3), and no deeper.
  CHECK(CheckMetadata(std::string(61, '[') + std::string(61, ']'), "m").ok());
  CHECK(!CheckMetadata(std::string(62, '[') + std::string(62, ']'), "m").ok());
  CHECK(DecodeJobs(R"({"prompts": [{"prompt": "a", "metadata": )" + std::string(61, '[') +
                   std::string(61, ']') + "}]}")
            .ok());
}

TEST_CASE("wire: a batch hands every group its job's metadata as text; none is no member") {
  Batch batch;
  batch.id = 3;
  const std::vector<std::string> metadata = {"{ \"answer\" : 1.0E0 }", "", "null",
                                             "[\"trajectories\"]"};
  for (size_t i = 0; i < metadata.size(); ++i) {
    batch.items.push_back(
        {Group("{\"samples\": [" + std::to_string(i) + "]}"), false, metadata[i]});
    batch.items.back().group.job = i + 1;
  }
  const std::string text = Encode(batch);
  const Json parsed = Json::parse(text);
  CHECK(parsed["trajectories"][0]["metadata"]["answer"] == 1.0);
  CHECK(!parsed["trajectories"][1].contains("metadata"));
  Result<Batch> decoded = DecodeBatch(text);
  REQUIRE_MESSAGE(decoded.ok(), decoded.status().ToString());
  REQUIRE(decoded->items.size() == metadata.size());
  CHECK(decoded->items[0].metadata == metadata[0]);
  CHECK(decoded->items[1].metadata.empty());
  CHECK(decoded->items[2].metadata.empty());  // null: none
  CHECK(decoded->items[3].metadata == metadata[3]);
  for (size_t i = 0; i < metadata.size(); ++i) {
    CHECK(decoded->items[i].group.trajectories == batch.items[i].group.trajectories);
    CHECK(decoded->items[i].group.job == i + 1);
  }
}

TEST_CASE("wire: the journal's group fields ignore other members and name what is missing") {
  Json fields = GroupFields(Group(""));
  fields["e"] = "submit";
  fields["t"] = 5;
  TrajectoryGroup g;
  REQUIRE(ReadGroupFields(fields, "event", &g).ok());
  CheckSameFields(g, Group(""));
  fields.erase("tokens");
  CHECK(ReadGroupFields(fields, "event", &g).message() == "event lacks the field 'tokens'");
}

TEST_CASE("wire: the cluster routes' answers, one type, checked for the event asked") {
  for (ClusterEvent event :
       {ClusterEvent::kRegistered, ClusterEvent::kHeartbeat, ClusterEvent::kDraining,
        ClusterEvent::kReleased, ClusterEvent::kDeregistered}) {
    const std::string text = Encode(ClusterAnswer{"c1", event, "tok"});
    Result<ClusterAnswer> back = DecodeClusterAnswer(text, event);
    REQUIRE_MESSAGE(back.ok(), back.status().ToString());
    CHECK(back->cluster == "c1");
    CHECK(back->cluster_token == (event == ClusterEvent::kRegistered ? "tok" : ""));
  }
  CHECK(Encode(ClusterAnswer{"c1", ClusterEvent::kRegistered, "tok"}) ==
        R"({"cluster":"c1","cluster_token":"tok","registered":true})");
  CHECK(Encode(ClusterAnswer{"c1", ClusterEvent::kHeartbeat, ""}) ==
        R"({"cluster":"c1","ok":true})");
  // The answer to another call, or a malformed one, is refused naming what is wrong.
  CHECK(DecodeClusterAnswer(R"({"cluster":"c1","ok":true})", ClusterEvent::kDraining)
            .status()
            .message() == "the answer lacks 'draining'");
  CHECK(DecodeClusterAnswer(R"({"ok":true})", ClusterEvent::kHeartbeat).status().message() ==
        "the answer lacks 'cluster'");
  CHECK(DecodeClusterAnswer(R"({"cluster":"c1","registered":true,"cluster_token":7})",
                            ClusterEvent::kRegistered)
            .status()
            .message() == "the answer's 'cluster_token' is not a string");
  CHECK(!DecodeClusterAnswer("[1]", ClusterEvent::kHeartbeat).ok());
  // Fields a newer orchestrator adds are ignored.
  CHECK(
      DecodeClusterAnswer(R"({"cluster":"c1","ok":true,"next":1})", ClusterEvent::kHeartbeat).ok());
}

// A status page with something in every field, and a cluster with and one without a sync report.
StatusPage FullStatusPage() {
  StatusPage page;
  page.run = "r1";
  page.latest_version = 12;
  page.admissible_version = 8;
  page.max_staleness = 4;
  page.jobs = {3, 2, 40, 30, 1};
  page.leases = {50, 4, 3, 2};
  page.clusters_lost = 1;
  page.trajectories = {5, 6, 31, 2, 1, 20, 3, 4};
  page.batches = {9, 1};
  page.buffered_by_version_start = {{7, 2}, {11, 3}};
  SyncReport sync;
  sync.bytes_downloaded = 123456789012;
  sync.pulls = 4;
  sync.max_pause_ms = 0.25;
  sync.first_version = 0;
  sync.newest_version = 12;
  sync.digest = "00ff";
  sync.engine_replicas = 1;
  sync.paused_ms_total = 2.5;
  sync.replicas = {{"http://10.0.0.1:30000", "ready", 12, 4, 1, 0.5, 2.5}};
  page.clusters.push_back({"eu-1", "eu", 4, 12, "ready", 2, 17, 1.5, 0.25, sync});
  page.clusters.push_back({"us-1", "us", 1, std::nullopt, "syncing", 0, 0, 0, 3, std::nullopt});
  page.regions["eu"] = {1, 1, 2, 12, sync};
  page.regions["eu"].sync.replicas.clear();
  page.regions["us"] = {1, 0, 0, std::nullopt, SyncReport{}};
  page.alerts = {"no version announced for 5m"};
  page.journal = {100, 40, 4096, 2, 1, 30};
  StatusPage::Region& eu = page.regions["eu"];
  eu.capacity = 4;
  eu.busy = 2;
  eu.utilisation = 0.5;
  eu.accepted = 17;
  eu.delivered = 20;
  eu.dropped_stale = 4;
  StatusPage::Version& v11 = page.versions.emplace_back();
  v11.version = 11;
  v11.announced_at = 1764820000.5;
  v11.publish_seconds = 0.75;
  v11.regions["eu"] = {1, 1, 0.25, 0.25, 0.25, 0, 1024};
  v11.regions["us"] = {1, 0, std::nullopt, std::nullopt, std::nullopt, 1, 0};
  StatusPage::Version& v12 = page.versions.emplace_back();
  v12.version = 12;
  v12.announced_at = 1764820002.5;
  v12.regions["eu"] = {1, 0, std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0};
  page.trainer = {3, 1.5, {0.25, 0.5, 0.75}, 2, 1.25};
  page.rates = {10, 2.5, 2, 3};
  page.staleness = {{0, 15}, {1, 5}};
  return page;
}

TEST_CASE("wire: the status page survives a round trip, in the shape docs/api.md gives") {
  const StatusPage page = FullStatusPage();
  const std::string text = Encode(page);
  Result<StatusPage> back = DecodeStatusPage(text, "status");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  CHECK(Encode(*back) == text);
  CHECK(back->run == "r1");
  CHECK(back->latest_version == 12);
  CHECK(back->jobs.given_up == 1);
  CHECK(back->trajectories.dropped_stale == 4);
  CHECK(back->buffered_by_version_start == page.buffered_by_version_start);
  REQUIRE(back->clusters.size() == 2);
  CHECK(back->clusters[0].throughput_per_s == 1.5);
  REQUIRE(back->clusters[0].sync.has_value());
  CHECK(SyncReportJson(*back->clusters[0].sync) == SyncReportJson(*page.clusters[0].sync));
  CHECK(!back->clusters[1].ready_version.has_value());
  CHECK(!back->clusters[1].sync.has_value());
  CHECK(back->regions.at("eu").newest_ready_version == 12);
  CHECK(back->regions.at("us").sync.pulls == 0);
  CHECK(back->alerts == page.alerts);
  CHECK(back->journal.remembered_done == 30);

  // The documented fields, and no other.
  const Json json = Json::parse(text);
  std::set<std::string> keys;
  for (const auto& [key, value] : json.items()) keys.insert(key);
  CHECK(keys == std::set<std::string>{"run", "latest_version", "admissible_version",
                                      "max_staleness", "jobs", "leases", "clusters_lost",
                                      "trajectories", "batches", "buffered_by_version_start",
                                      "clusters", "regions", "alerts", "journal", "versions",
                                      "trainer", "rates", "staleness"});
  REQUIRE(back->versions.size() == 2);
  CHECK(back->versions[0].regions.at("eu").ready_90_seconds == 0.25);
  CHECK(back->versions[0].regions.at("us").missed == 1);
  CHECK(!back->versions[1].publish_seconds);
  CHECK(back->trainer.recent_wait_seconds == std::vector<double>{0.25, 0.5, 0.75});
  CHECK(back->rates.delivered_per_s == 2);
  CHECK(back->staleness == page.staleness);
  CHECK(back->regions.at("eu").utilisation == 0.5);
  CHECK(json["buffered_by_version_start"] == Json{{"7", 2}, {"11", 3}});
  CHECK(json["clusters"][1] == Json{{"id", "us-1"},
                                    {"region", "us"},
                                    {"capacity", 1},
                                    {"ready_version", nullptr},
                                    {"state", "syncing"},
                                    {"leases", 0},
                                    {"completed", 0},
                                    {"throughput_per_s", 0.0},
                                    {"seconds_since_heartbeat", 3.0}});
  CHECK(json["clusters"][0]["sync"]["replicas"][0]["url"] == "http://10.0.0.1:30000");
  CHECK(!json["regions"]["eu"]["sync"].contains("replicas"));  // a region sums, not lists
  CHECK(json["regions"]["us"]["newest_ready_version"].is_null());
  CHECK(json["journal"]["bytes"] == 4096);
}

// The golden status body both this suite and the Python package's are held to.
Json StatusGolden() {
  std::ifstream in(weft::testing::TestDataDir() + "/status.json");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

TEST_CASE("wire: the golden status body is the encoder's, and its broken copies are refused") {
  const Json golden = StatusGolden();
  // The file follows the encoder: a change to the page's shape changes it (and the Python test).
  CHECK(Json::parse(Encode(FullStatusPage())) == golden["body"]);
  Result<StatusPage> decoded = DecodeStatusPage(golden["body"].dump(), "status");
  REQUIRE_MESSAGE(decoded.ok(), decoded.status().ToString());
  CHECK(Json::parse(Encode(*decoded)) == golden["body"]);

  REQUIRE(golden["bad"].size() >= 15);
  for (const Json& c : golden["bad"]) {
    CAPTURE(c["name"].get<std::string>());
    const std::string body =
        c.contains("text") ? c["text"].get<std::string>() : golden["body"].patch(c["patch"]).dump();
    Result<StatusPage> page = DecodeStatusPage(body, "status");
    REQUIRE(!page.ok());
    CHECK(page.status().code() == StatusCode::kInvalidArgument);
    const std::string error = c["error"];
    if (c.value("prefix", false)) {
      CHECK_MESSAGE(page.status().message().starts_with(error), page.status().message());
    } else {
      CHECK(page.status().message() == error);
    }
  }
  CHECK(DecodeStatusPage("{", "status").status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::orchestrator::wire

namespace weft::orchestrator::wire {
namespace {

TEST_CASE("wire: models and score jobs: round trips, and refusals that name the field") {
  const std::string digest = "0123456789abcdef0123456789abcdef";
  Registration r{"t", "us", 2, {"teacher", digest}};
  Result<Registration> back = DecodeRegistration(Encode(r));
  REQUIRE(back.ok());
  CHECK(back->model.name == "teacher");
  CHECK(back->model.digest == digest);
  CHECK(DecodeRegistration(R"({"cluster": "c", "region": "r", "capacity": 1, "model": "t"})")
            .status()
            .message() == "cluster: a fixed model needs both 'model' and 'model_digest'");
  CHECK(DecodeRegistration(
            R"({"cluster": "c", "region": "r", "capacity": 1, "model": "t", "model_digest": "XY"})")
            .status()
            .message() == "cluster.model_digest is not 16 to 128 lowercase hex digits");

  JobSpec score{"[1,2]", 2};
  score.model = "teacher";
  score.kind = JobKind::kScore;
  score.targets = "[[3,4],[5]]";
  Result<std::vector<JobSpec>> jobs = DecodeJobs(EncodeJobs({{"\"p\"", 3}, score}));
  REQUIRE(jobs.ok());
  CHECK((*jobs)[0].kind == JobKind::kGenerate);
  CHECK((*jobs)[0].model.empty());
  CHECK((*jobs)[1].kind == JobKind::kScore);
  CHECK((*jobs)[1].model == "teacher");
  CHECK((*jobs)[1].targets == "[[3,4],[5]]");
  CHECK((*jobs)[1].samples == 2);
  auto refused = [](const std::string& body) { return DecodeJobs(body).status().message(); };
  CHECK(refused(R"({"prompts": [{"prompt": "a", "kind": "score", "targets": [[1]]}]})") ==
        "jobs.prompts[0].prompt of a score job must be token ids (0 to 2^31-1)");
  CHECK(refused(R"({"prompts": [{"prompt": [1], "kind": "score"}]})") ==
        "jobs.prompts[0].targets must be 1 to 4096 completions to score");
  CHECK(refused(R"({"prompts": [{"prompt": [1], "kind": "score", "targets": [[1], []]}]})") ==
        "jobs.prompts[0].targets[1] is not 1 to 65536 token ids (0 to 2^31-1)");
  CHECK(refused(
            R"({"prompts": [{"prompt": [1], "kind": "score", "targets": [[1]], "samples": 2}]})") ==
        "jobs.prompts[0].samples must be the number of targets, 1");
  CHECK(refused(R"({"prompts": [{"prompt": "a", "targets": [[1]]}]})") ==
        "jobs.prompts[0].targets is for score jobs only");
  CHECK(refused(R"({"prompts": [{"prompt": "a", "kind": "rank"}]})") ==
        "jobs.prompts[0].kind: 'rank' is not a job kind (generate or score)");

  // What the journal and snapshots hold is checked as the route checks it.
  CHECK(CheckTargets("", JobKind::kGenerate, "t").ok());
  CHECK(CheckTargets("[[1,2]]", JobKind::kScore, "t").ok());
  CHECK(CheckTargets("[[1]]", JobKind::kGenerate, "t").message() ==
        "t: a generate job has no targets");
  CHECK(CheckTargets("[[1],", JobKind::kScore, "t").message() == "t: the targets are not JSON");
  CHECK(CheckTargets("[[-1]]", JobKind::kScore, "t").message() ==
        "t.targets[0] is not 1 to 65536 token ids (0 to 2^31-1)");

  // Leases and batches carry the model and kind; the policy's generate jobs carry neither.
  Lease lease{1, 1, 5, 0, "[1,2]", 2};
  lease.model = "teacher";
  lease.kind = JobKind::kScore;
  lease.targets = "[[3,4],[5]]";
  Result<LeaseAnswer> leases =
      DecodeLeases(EncodeLeases({{lease, Lease{2, 1, 5, 0, "\"p\"", 1}}, std::nullopt}));
  REQUIRE(leases.ok());
  CHECK(leases->leases[0].kind == JobKind::kScore);
  CHECK(leases->leases[0].targets == "[[3,4],[5]]");
  CHECK(leases->leases[0].model == "teacher");
  CHECK(leases->leases[1].kind == JobKind::kGenerate);
  CHECK(EncodeLeases({{Lease{2, 1, 5, 0, "\"p\"", 1}}, std::nullopt}).find("kind") ==
        std::string::npos);
  Batch batch;
  batch.id = 3;
  Delivered d;
  d.group.job = 1;
  d.group.attempt = 1;
  d.group.cluster = "t";
  d.group.segments = {{0, 0}};
  d.group.trajectories = "{}";
  d.model = "teacher";
  d.kind = JobKind::kScore;
  batch.items.push_back(d);
  Result<Batch> decoded = DecodeBatch(Encode(batch));
  REQUIRE(decoded.ok());
  CHECK(decoded->items[0].model == "teacher");
  CHECK(decoded->items[0].kind == JobKind::kScore);
}

}  // namespace
}  // namespace weft::orchestrator::wire
