// weft generate CONFIG: a run with no trainer. A fixed model's workers (the run's processes, as
// `weft run` starts them: cli/run_processes.h) sample completions of a JSONL dataset's prompts,
// and this process writes them as sharded JSONL records, each (prompt, sample) exactly once,
// however often the orchestrator, the workers or this process itself are killed: the output
// directory is the record of what is done, written and fsynced before the batch that brought it
// is acknowledged, and read back (a torn last line cut off) when the command runs again, which
// then generates only what is missing. Formats: docs/formats.md, "Generated records"; keys:
// docs/run.md, "Generating datasets".
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli/commands.h"
#include "cli/run_config.h"
#include "cli/run_processes.h"
#include "cli/supervisor.h"
#include "common/byte_io.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "orchestrator/client.h"
#include "policy_store/manifest.h"
#include "policy_store/object_store.h"
#include "policy_store/publish.h"
#include "policy_store/reader.h"
#include "sync/safetensors.h"
#include "trainer_adapter/dataset.h"
#include "trainer_adapter/received_group.h"

namespace weft::cli {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

const char kRunMarker[] = ".weft-generate";
const char kOutputMarker[] = "weft-generate.json";

// The SHA-256 of a file, read a piece at a time.
Result<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  policy_store::Sha256 hash;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hash.Update(
        {reinterpret_cast<const uint8_t*>(buffer.data()), static_cast<size_t>(in.gcount())});
  }
  if (in.bad()) return Unavailable("reading " + path + " failed");
  return hash.HexDigest();
}

// An s3:// URI of one object, or of a prefix, split into the store above it and the last segment:
// s3://BUCKET/A/B?OPTIONS is the store s3://BUCKET/A?OPTIONS and the name B. `what` names the key
// in errors.
struct ObjectUri {
  std::string store;
  std::string name;
};

Result<ObjectUri> SplitObjectUri(const std::string& uri, const std::string& what) {
  const size_t query = uri.find('?');
  const std::string path = uri.substr(0, query);
  const std::string options = query == std::string::npos ? "" : uri.substr(query);
  const size_t bucket_end = path.find('/', 5);  // after "s3://"
  const size_t last = path.rfind('/');
  if (bucket_end == std::string::npos || last == path.size() - 1 || last < bucket_end) {
    return InvalidArgument(what + ": '" + uri + "' names a bucket, not an object under it (s3://" +
                           "BUCKET/KEY)");
  }
  ObjectUri out{path.substr(0, last) + options, path.substr(last + 1)};
  WEFT_RETURN_IF_ERROR(policy_store::ValidateKey(out.name).WithContext(what));
  return out;
}

bool IsS3(const std::string& location) { return location.rfind("s3://", 0) == 0; }

// Where a download goes: a file written in order (started over when the store reads the object
// again from its start).
class DownloadTarget : public BodyTarget {
 public:
  explicit DownloadTarget(int fd) : fd_(fd) {}
  Status Write(std::span<const uint8_t> bytes) override {
    return WriteAll(fd_, bytes, "writing a download");
  }
  Status Rewind() override {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0)
      return Unavailable("restarting a download: " + ErrnoText());
    return Status::Ok();
  }

 private:
  int fd_;
};

// Copies object `key` of `store` to the file `path` (replaced), in bounded memory.
Status Download(policy_store::ObjectStore& store, const std::string& key, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable("cannot create " + path + ": " + ErrnoText());
  DownloadTarget target(fd);
  Result<uint64_t> read = store.ReadTo(key, 0, UINT64_MAX, target);
  ::close(fd);
  return read.status().WithContext("reading " + key + " of " + store.Describe());
}

// The fixed model the run generates with: published from the checkpoint as its run's first
// version when that run has none, and otherwise checked to be the checkpoint's weights.
struct ModelIdentity {
  std::string digest;
  uint64_t version = 0;
};

Result<ModelIdentity> PrepareModel(const RunConfig& config, const fs::path& dir) {
  const FixedModelConfig& fixed = *config.FindFixedModel(config.generate.model);
  policy_store::OpenOptions open;
  open.create = true;
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<policy_store::ObjectStore> store,
                        policy_store::OpenStore(config.publish_store(dir.string()), open));
  policy_store::StoreReader reader(*store, fixed.run, 1);
  Result<uint64_t> latest = reader.Latest();
  if (!latest.ok() && latest.status().code() != StatusCode::kNotFound) return latest.status();
  std::optional<std::string> wanted;  // the checkpoint's digest
  std::optional<sync::ServedModel> model;
  if (!config.generate.checkpoint.empty()) {
    WEFT_ASSIGN_OR_RETURN(sync::SafetensorsFile file,
                          sync::SafetensorsFile::Open(config.generate.checkpoint));
    model = sync::ServedModel::FromSafetensors(file, ThreadsOrAll(0));
    wanted = policy_store::StateDigest(*model);
  }
  if (!latest.ok()) {
    if (!model) {
      return InvalidArgument("generate: the store has no version of run " + fixed.run + " (model " +
                             fixed.name + ") and generate.checkpoint names none to publish");
    }
    WEFT_ASSIGN_OR_RETURN(
        policy_store::Manifest published,
        policy_store::PublishModel(*store, fixed.run, *model, policy_store::KeyframePolicy{},
                                   ThreadsOrAll(0), uint64_t{0}));
    std::printf("published %s as run %s version 0 of the store\n",
                config.generate.checkpoint.c_str(), fixed.run.c_str());
    return ModelIdentity{policy_store::StateDigest(published), published.version};
  }
  WEFT_ASSIGN_OR_RETURN(policy_store::Manifest manifest, reader.GetManifest(*latest));
  const std::string digest = policy_store::StateDigest(manifest);
  if (wanted && *wanted != digest) {
    return InvalidArgument("generate.checkpoint " + config.generate.checkpoint + " (digest " +
                           *wanted + ") is not run " + fixed.run + " version " +
                           std::to_string(*latest) + " of the store (digest " + digest +
                           "); give the model another run (fixed_models[].run)");
  }
  return ModelIdentity{digest, manifest.version};
}

// The output: its records, read back when it is opened, and the shards being written. A directory
// output is written in place. An s3:// output is written to a staging directory of the run, each
// record fsynced there before its batch is acknowledged as in a directory, and each shard uploaded
// whole once it is full (or the run is complete), then removed from the staging directory: the
// bucket only ever holds complete shards, and on a rerun what is done is the bucket's shards plus
// the staging directory's.
class Output {
 public:
  // `location`: a directory or s3://BUCKET/PREFIX; `run_dir`: where an s3:// output stages its
  // shards; `ids`: each prompt's id as its record holds it (JSON text) -> its index; `samples`:
  // how many each prompt wants.
  static Result<Output> Open(const std::string& location, const fs::path& run_dir,
                             const Json& identity, const std::map<std::string, size_t>& ids,
                             const std::vector<uint32_t>& samples, uint64_t shard_records) {
    Output out;
    out.location_ = location;
    out.dir_ = location;
    out.shard_records_ = shard_records;
    for (uint32_t n : samples) out.done_.emplace_back(n, false);
    if (IsS3(location)) {
      WEFT_ASSIGN_OR_RETURN(const ObjectUri uri, SplitObjectUri(location, "generate.output"));
      WEFT_ASSIGN_OR_RETURN(out.remote_, policy_store::OpenStore(uri.store));
      out.prefix_ = uri.name + "/";
      out.dir_ = (run_dir / "output-staging").string();
    }
    std::error_code error;
    fs::create_directories(out.dir_, error);
    if (error) return Unavailable("cannot create " + out.dir_ + ": " + error.message());
    // What the output holds, listed once: the names under the prefix (for an s3:// output), and
    // the files of the directory written to (after the claim, which may empty it).
    std::vector<std::string> remote_names;
    if (out.remote_) {
      WEFT_ASSIGN_OR_RETURN(remote_names, out.remote_->List(out.prefix_));
      for (std::string& key : remote_names) key.erase(0, out.prefix_.size());
      WEFT_RETURN_IF_ERROR(out.ClaimRemote(identity, remote_names));
      // The staging directory holds this output's records only: another output's (the config
      // changed since) were never uploaded, and belong to nothing now.
      const Json staged = {{"output", location}, {"identity", identity}};
      const std::string marker = out.dir_ + "/" + kOutputMarker;
      Result<std::vector<uint8_t>> held = ReadFile(marker);
      if (!held.ok() || Json::parse(held->begin(), held->end(), nullptr, false) != staged) {
        for (const auto& entry : fs::directory_iterator(out.dir_)) fs::remove_all(entry.path());
        WEFT_RETURN_IF_ERROR(WriteTextFileAtomic(marker, staged.dump() + "\n"));
      }
    } else {
      WEFT_RETURN_IF_ERROR(out.ClaimDirectory(identity));
    }
    std::vector<std::string> local_names;
    for (const auto& entry : fs::directory_iterator(out.dir_))
      local_names.push_back(entry.path().filename().string());
    for (const char* kind : {"part", "rejected"})
      WEFT_RETURN_IF_ERROR(out.Recover(kind, ids, remote_names, local_names));
    return out;
  }

  Output(Output&&) = default;
  ~Output() {
    for (auto& [kind, shard] : shards_) {
      if (shard.fd >= 0) ::close(shard.fd);
    }
  }

  bool Done(size_t prompt, uint32_t sample) const {
    return sample < done_[prompt].size() && done_[prompt][sample];
  }
  uint64_t records() const { return records_; }
  uint64_t kept() const { return kept_; }
  uint64_t uploaded() const { return uploaded_; }

  // Appends the records (each one line of JSON, with `prompt` and `sample` its place) to the
  // current shard of `kind`; Sync makes them durable.
  Status Add(const char* kind, size_t prompt, uint32_t sample, const std::string& line) {
    Shard& shard = shards_[kind];
    if (shard.records >= shard_records_) WEFT_RETURN_IF_ERROR(Seal(kind, shard));
    if (shard.fd < 0) {
      const std::string path = ShardPath(kind, shard.number);
      shard.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (shard.fd < 0) return Unavailable("cannot open " + path + ": " + ErrnoText());
      WEFT_RETURN_IF_ERROR(SyncParentDirectory(path));
    }
    shard.pending += line;
    shard.pending += '\n';
    ++shard.records;
    done_[prompt][sample] = true;
    ++records_;
    if (std::string(kind) == "part") ++kept_;
    return Status::Ok();
  }

  // Writes what was added and fsyncs it: after this, the records survive any crash.
  Status Sync() {
    for (auto& [kind, shard] : shards_) WEFT_RETURN_IF_ERROR(Flush(kind.c_str(), shard));
    return Status::Ok();
  }

  // Every record is there: an s3:// output uploads its last shards, which are not full.
  Status Finish() {
    WEFT_RETURN_IF_ERROR(Sync());
    for (auto& [kind, shard] : shards_) {
      if (shard.records > 0) WEFT_RETURN_IF_ERROR(Seal(kind.c_str(), shard));
    }
    return Status::Ok();
  }

 private:
  struct Shard {
    int number = 0;        // the shard being written
    uint64_t records = 0;  // in it
    int fd = -1;
    std::string pending;  // added, not written yet
  };

  Output() = default;

  static std::string ShardName(const std::string& kind, int number) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s-%05d.jsonl", kind.c_str(), number);
    return name;
  }
  std::string ShardPath(const std::string& kind, int number) const {
    return dir_ + "/" + ShardName(kind, number);
  }
  // The shard numbers of `kind` among `names`, sorted.
  static std::vector<int> ShardNumbers(const std::string& kind,
                                       const std::vector<std::string>& names) {
    std::vector<int> numbers;
    for (const std::string& name : names) {
      int number = -1;
      if (name.size() == kind.size() + 12 && name.rfind(kind + "-", 0) == 0 &&
          std::sscanf(name.c_str() + kind.size() + 1, "%5d", &number) == 1 &&
          ShardName(kind, number) == name) {
        numbers.push_back(number);
      }
    }
    std::sort(numbers.begin(), numbers.end());
    return numbers;
  }

  // A directory output: its marker says whose records it holds; a new one must be empty.
  Status ClaimDirectory(const Json& identity) {
    const std::string marker = dir_ + "/" + kOutputMarker;
    Result<std::vector<uint8_t>> held = ReadFile(marker);
    if (held.ok()) return CheckIdentity(*held, identity);
    if (held.status().code() != StatusCode::kNotFound) return held.status();
    for (const auto& entry : fs::directory_iterator(dir_)) {
      return InvalidArgument("generate.output " + location_ + " holds " +
                             entry.path().filename().string() +
                             ", which weft generate did not write; give an empty directory");
    }
    return WriteTextFileAtomic(marker, identity.dump() + "\n");
  }

  // An s3:// output: the same, with the marker an object under the prefix (`names`: what the
  // prefix holds, relative to it).
  Status ClaimRemote(const Json& identity, const std::vector<std::string>& names) {
    const std::string marker = prefix_ + kOutputMarker;
    Result<std::vector<uint8_t>> held = remote_->Get(marker);
    if (held.ok()) return CheckIdentity(*held, identity);
    if (held.status().code() != StatusCode::kNotFound) return held.status();
    if (!names.empty()) {
      return InvalidArgument("generate.output " + location_ + " holds " + prefix_ + names.front() +
                             ", which weft generate did not write; give an empty prefix");
    }
    const std::string text = identity.dump() + "\n";
    Status put = remote_->PutImmutable(marker, TextBytes(text));
    if (put.code() == StatusCode::kConflict) {  // another run claimed it meanwhile
      WEFT_ASSIGN_OR_RETURN(held, remote_->Get(marker));
      return CheckIdentity(*held, identity);
    }
    return put;
  }

  Status CheckIdentity(const std::vector<uint8_t>& held, const Json& identity) const {
    const Json theirs = Json::parse(held.begin(), held.end(), nullptr, false);
    if (theirs == identity) return Status::Ok();
    return InvalidArgument("generate.output " + location_ + " holds another run's records (its " +
                           kOutputMarker + ": " +
                           (theirs.is_discarded() ? std::string("not JSON") : theirs.dump()) +
                           "; this run: " + identity.dump() + "); give another output");
  }

  Status Flush(const char* kind, Shard& shard) {
    WEFT_RETURN_IF_ERROR(
        WriteAll(shard.fd, TextBytes(shard.pending), "writing " + ShardPath(kind, shard.number)));
    shard.pending.clear();
    if (shard.fd >= 0 && ::fsync(shard.fd) != 0)
      return Unavailable("fsync of " + ShardPath(kind, shard.number) + ": " + ErrnoText());
    return Status::Ok();
  }

  // The current shard is complete: written and closed, uploaded for an s3:// output, and the
  // next one begins.
  Status Seal(const char* kind, Shard& shard) {
    if (shard.fd >= 0) {
      WEFT_RETURN_IF_ERROR(Flush(kind, shard));
      ::close(shard.fd);
      shard.fd = -1;
    }
    if (remote_) WEFT_RETURN_IF_ERROR(Upload(kind, shard.number));
    ++shard.number;
    shard.records = 0;
    return Status::Ok();
  }

  // Uploads a complete staged shard under the prefix and removes it from the staging directory.
  // Uploading the same bytes again (a crash after the upload, before the removal) is harmless.
  Status Upload(const std::string& kind, int number) {
    const std::string path = ShardPath(kind, number);
    const std::string key = prefix_ + ShardName(kind, number);
    {
      WEFT_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
      Status put = remote_->PutImmutable(key, file.bytes());
      if (put.code() == StatusCode::kConflict) {
        return DataLoss(location_ + "/" + ShardName(kind, number) + " holds other records than " +
                        path + " (written by another run?)");
      }
      WEFT_RETURN_IF_ERROR(put.WithContext("uploading " + path));
    }
    ++uploaded_;
    std::error_code error;
    fs::remove(path, error);
    if (error) return Unavailable("cannot remove " + path + ": " + error.message());
    return SyncParentDirectory(path);
  }

  // Reads the shards of `kind` back: the uploaded ones (an s3:// output), then the staged or
  // written ones. Every complete line must be a record of this run's prompts, each (prompt,
  // sample) once; the last local shard's last line, when a crash left it without its end, is cut
  // off (it was never acknowledged); anything else damaged is refused, naming the shard and line.
  // `remote_names` and `local_names`: what the prefix and the directory written to hold.
  Status Recover(const std::string& kind, const std::map<std::string, size_t>& ids,
                 const std::vector<std::string>& remote_names,
                 const std::vector<std::string>& local_names) {
    Shard& shard = shards_[kind];
    const std::vector<int> remote_numbers = ShardNumbers(kind, remote_names);
    if (remote_) {
      const std::string copy = dir_ + "/.download";
      for (int number : remote_numbers) {
        WEFT_RETURN_IF_ERROR(Download(*remote_, prefix_ + ShardName(kind, number), copy));
        uint64_t records = 0;
        WEFT_RETURN_IF_ERROR(
            ReadShard(kind, copy, location_ + "/" + ShardName(kind, number), false, ids, &records));
      }
      fs::remove(copy);
    }
    std::vector<int> local_numbers;
    for (int number : ShardNumbers(kind, local_names)) {
      if (std::binary_search(remote_numbers.begin(), remote_numbers.end(), number)) {
        // Uploaded before a crash that left it here: the bucket's copy counts.
        fs::remove(ShardPath(kind, number));
        continue;
      }
      local_numbers.push_back(number);
    }
    for (size_t i = 0; i < local_numbers.size(); ++i) {
      const std::string path = ShardPath(kind, local_numbers[i]);
      uint64_t records = 0;
      WEFT_RETURN_IF_ERROR(
          ReadShard(kind, path, path, i + 1 == local_numbers.size(), ids, &records));
      shard.number = local_numbers[i];
      shard.records = records;
      // Staged shards before the last, or a full last one, were not uploaded yet.
      if (remote_ && (i + 1 < local_numbers.size() || records >= shard_records_))
        WEFT_RETURN_IF_ERROR(Seal(kind.c_str(), shard));
    }
    if (!remote_numbers.empty() && remote_numbers.back() >= shard.number) {
      shard.number = remote_numbers.back() + 1;  // the bucket's last shard is complete
      shard.records = 0;
    }
    return Status::Ok();
  }

  // The records of one shard file (`name` in messages) into done_; `may_tear`: its last line may
  // lack its end (cut off in the file).
  Status ReadShard(const std::string& kind, const std::string& path, const std::string& name,
                   bool may_tear, const std::map<std::string, size_t>& ids, uint64_t* records) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Unavailable("cannot read " + path);
    std::string line;
    uint64_t line_number = 0, complete_bytes = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (in.eof()) {
        // No newline: the write a crash cut short.
        if (!may_tear)
          return DataLoss(name + ":" + std::to_string(line_number) +
                          ": a record cut short in a shard that is not the last");
        std::printf("%s:%llu: a record cut short by a crash; cut off and generated again\n",
                    name.c_str(), static_cast<unsigned long long>(line_number));
        in.close();
        fs::resize_file(path, complete_bytes);
        break;
      }
      complete_bytes += line.size() + 1;
      const std::string where = name + ":" + std::to_string(line_number);
      const Json record = Json::parse(line, nullptr, false);
      if (record.is_discarded() || !record.is_object() || !record.contains("prompt_id") ||
          !record.contains("sample") || !record["sample"].is_number_unsigned())
        return DataLoss(where + ": not a record of weft generate (damaged?)");
      auto id = ids.find(record["prompt_id"].dump());
      if (id == ids.end())
        return DataLoss(where + ": prompt id " + record["prompt_id"].dump() +
                        " is not in the dataset");
      const uint64_t sample = record["sample"].get<uint64_t>();
      if (sample >= done_[id->second].size())
        return DataLoss(where + ": sample " + std::to_string(sample) + " of prompt " +
                        record["prompt_id"].dump() + " is beyond its " +
                        std::to_string(done_[id->second].size()) + " samples");
      if (done_[id->second][sample])
        return DataLoss(where + ": prompt " + record["prompt_id"].dump() + " sample " +
                        std::to_string(sample) + " is there twice");
      done_[id->second][sample] = true;
      ++records_;
      if (kind == "part") ++kept_;
      ++*records;
    }
    return Status::Ok();
  }

  std::string location_;  // generate.output
  std::string dir_;       // where shards are written: the output directory, or the staging one
  std::unique_ptr<policy_store::ObjectStore> remote_;  // an s3:// output's store
  std::string prefix_;                                 // its key prefix, ending in '/'
  uint64_t shard_records_ = 0;
  std::vector<std::vector<bool>> done_;
  uint64_t records_ = 0, kept_ = 0, uploaded_ = 0;
  std::map<std::string, Shard> shards_;
};

std::string Duration(double seconds) {
  char text[32];
  if (seconds < 120) {
    std::snprintf(text, sizeof(text), "%.0f s", seconds);
  } else if (seconds < 7200) {
    std::snprintf(text, sizeof(text), "%.1f min", seconds / 60);
  } else {
    std::snprintf(text, sizeof(text), "%.1f h", seconds / 3600);
  }
  return text;
}

Status RunGenerate(const std::string& config_path) {
  WEFT_ASSIGN_OR_RETURN(RunConfig config, LoadRunConfig(config_path));
  const GenerateSettings& g = config.generate;
  if (!g.present) return InvalidArgument(config_path + " has no generate: section");
  WEFT_RETURN_IF_ERROR(config.NeedTokens(true, true, true));
  // The run directory: kept between runs (the store holds the model), but the orchestrator starts
  // afresh: what is done is what the output holds.
  const fs::path dir = fs::absolute(config.dir);
  std::error_code error;
  if (fs::exists(dir) && !fs::is_empty(dir) && !fs::exists(dir / kRunMarker)) {
    return InvalidArgument("run.dir " + dir.string() +
                           " holds files weft generate did not write; pick another run.dir");
  }
  fs::create_directories(dir, error);
  if (error) return Internal("cannot create " + dir.string() + ": " + error.message());
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("orchestrator.journal", 0) == 0 || name == "relays" || name == "logs")
      fs::remove_all(entry.path(), error);
  }
  fs::create_directories(dir / "logs", error);
  if (config.store_uri.empty()) fs::create_directories(dir / "store", error);
  std::ofstream(dir / kRunMarker) << "made by weft generate\n";

  // The dataset: every line checked, each with an id of its own.
  // One on s3:// is copied to the run directory first (a piece at a time), then read as a file.
  std::string dataset_path = g.dataset;
  if (IsS3(g.dataset)) {
    WEFT_ASSIGN_OR_RETURN(const ObjectUri uri, SplitObjectUri(g.dataset, "generate.dataset"));
    WEFT_ASSIGN_OR_RETURN(std::unique_ptr<policy_store::ObjectStore> store,
                          policy_store::OpenStore(uri.store));
    dataset_path = (dir / "dataset.jsonl").string();
    WEFT_RETURN_IF_ERROR(Download(*store, uri.name, dataset_path).WithContext("generate.dataset"));
  }
  Result<std::vector<trainer_adapter::DatasetPrompt>> read =
      trainer_adapter::ReadPromptDataset(dataset_path);
  if (!read.ok()) {
    // Named as the config names it.
    std::string message = read.status().message();
    if (dataset_path != g.dataset && message.rfind(dataset_path, 0) == 0)
      message = g.dataset + message.substr(dataset_path.size());
    return Status(read.status().code(), message);
  }
  std::vector<trainer_adapter::DatasetPrompt> dataset = std::move(*read);
  std::map<std::string, size_t> ids;
  std::vector<uint32_t> wanted;
  uint64_t total = 0;
  for (size_t i = 0; i < dataset.size(); ++i) {
    const trainer_adapter::DatasetPrompt& p = dataset[i];
    const std::string where = g.dataset + ":" + std::to_string(p.line);
    if (p.id.is_null())
      return InvalidArgument(where + ": the prompt has no id (weft generate needs one per line)");
    auto [at, added] = ids.emplace(p.id.dump(), i);
    if (!added)
      return InvalidArgument(where + ": id " + p.id.dump() + " is also the id of line " +
                             std::to_string(dataset[at->second].line));
    wanted.push_back(p.samples.value_or(g.samples));
    total += wanted.back();
  }
  WEFT_ASSIGN_OR_RETURN(std::string dataset_sha, FileSha256(dataset_path));

  WEFT_ASSIGN_OR_RETURN(ModelIdentity model, PrepareModel(config, dir));
  const Json identity = {{"model", g.model},
                         {"model_digest", model.digest},
                         {"dataset_sha256", dataset_sha},
                         {"samples", g.samples},
                         {"min_reward", g.min_reward ? Json(*g.min_reward) : Json(nullptr)}};
  WEFT_ASSIGN_OR_RETURN(Output output,
                        Output::Open(g.output, dir, identity, ids, wanted, g.shard_records));
  const uint64_t done_before = output.records();
  // What is left: each prompt's missing samples, in the dataset's order.
  std::deque<size_t> queue;
  std::vector<bool> in_flight(dataset.size(), false);
  auto missing = [&](size_t p) {
    std::vector<uint32_t> list;
    for (uint32_t s = 0; s < wanted[p]; ++s) {
      if (!output.Done(p, s)) list.push_back(s);
    }
    return list;
  };
  for (size_t p = 0; p < dataset.size(); ++p) {
    if (!missing(p).empty()) queue.push_back(p);
  }
  std::printf("weft generate %s: %llu of %llu samples already in %s; model %s (digest %s)\n",
              config_path.c_str(), static_cast<unsigned long long>(done_before),
              static_cast<unsigned long long>(total), g.output.c_str(), g.model.c_str(),
              model.digest.c_str());
  std::fflush(stdout);

  const std::string config_abs = fs::absolute(config_path).string();
  WEFT_ASSIGN_OR_RETURN(RunProcesses processes, PlanRunProcesses(config, dir, config_abs));
  std::vector<Child>& children = processes.children;
  WEFT_ASSIGN_OR_RETURN(const std::string self, ThisProgramPath());
  StopSignals stop;
  Supervisor supervisor(self, (dir / "logs").string());
  if (output.records() < total)
    WEFT_RETURN_IF_ERROR(StartRunProcesses(supervisor, children, processes.first_worker, dir));

  // Short calls: this loop also restarts the infrastructure (an orchestrator that died is restarted
  // between two calls, not after a call has waited out a long deadline).
  HttpClientOptions http;
  http.deadline = std::chrono::milliseconds(3000);
  orchestrator::OrchestratorClient client(config.orchestrator_url(),
                                          config.orchestrator.service.trainer_token, http);
  const bool tty = isatty(1);
  const auto started = Clock::now();
  std::optional<Clock::time_point> first_record;
  auto last_line = Clock::now(), last_check = Clock::now();
  uint64_t jobs_out = 0, duplicates = 0, written = 0;
  std::string failure;
  bool interrupted = false;
  while (output.records() < total) {
    if (stop.WaitFor(std::chrono::milliseconds(0))) {
      interrupted = true;
      break;
    }
    ReapRunProcesses(supervisor, children, dir, tty, &failure);
    if (!failure.empty()) break;
    // Keep jobs_ahead jobs out: one per prompt, for the samples it misses.
    std::vector<orchestrator::NewJob> jobs;
    std::vector<size_t> prompts;
    while (jobs_out + jobs.size() < g.jobs_ahead && !queue.empty() && jobs.size() < 1000) {
      const size_t p = queue.front();
      queue.pop_front();
      const std::vector<uint32_t> samples = missing(p);
      if (samples.empty() || in_flight[p]) continue;
      orchestrator::NewJob job;
      job.prompt = dataset[p].prompt;
      job.samples = static_cast<uint32_t>(samples.size());
      job.metadata = {{"p", p}, {"s", samples}};
      job.model = g.model;
      jobs.push_back(std::move(job));
      prompts.push_back(p);
    }
    if (!jobs.empty()) {
      Result<std::vector<uint64_t>> added = client.AddJobs(jobs);
      if (!added.ok()) {
        // Perhaps added (the answer was lost): the prompts are asked again only if their
        // samples do not arrive (below); a repeat is written once all the same.
        WEFT_LOG(kWarning) << "generate: adding " << jobs.size()
                           << " jobs: " << added.status().message();
      }
      for (size_t p : prompts) in_flight[p] = true;
      jobs_out += prompts.size();
    }
    Result<std::vector<orchestrator::Delivered>> batch =
        client.TakeBatch(256, std::chrono::milliseconds(1000));
    if (!batch.ok()) {
      WEFT_LOG(kWarning) << "generate: taking a batch: " << batch.status().message();
      continue;
    }
    for (const orchestrator::Delivered& d : *batch) {
      const std::string what = "job " + std::to_string(d.group.job);
      const Json meta = Json::parse(d.metadata, nullptr, false);
      if (meta.is_discarded() || !meta.is_object() || !meta.contains("p") ||
          !meta["p"].is_number_unsigned() || meta["p"].get<uint64_t>() >= dataset.size() ||
          !meta.contains("s") || !meta["s"].is_array()) {
        WEFT_LOG(kError) << "generate: " << what << " is not one of this run's; skipped";
        continue;
      }
      const size_t p = meta["p"].get<size_t>();
      Result<trainer_adapter::ReceivedGroup> group = trainer_adapter::ParseGroup(d, 0);
      if (!group.ok() || group->samples.size() != meta["s"].size()) {
        WEFT_LOG(kError) << "generate: " << what << ": "
                         << (group.ok() ? "its samples do not match its job"
                                        : group.status().message())
                         << "; the prompt is asked again";
      } else {
        for (size_t i = 0; i < group->samples.size(); ++i) {
          const trainer_adapter::ReceivedSample& s = group->samples[i];
          const auto sample = meta["s"][i].get<uint32_t>();
          if (output.Done(p, sample)) {
            ++duplicates;  // a batch handed out again, or a job added twice
            continue;
          }
          const bool keep = !g.min_reward || (s.reward && *s.reward >= *g.min_reward);
          Json record = {{"prompt_id", dataset[p].id},
                         {"sample", sample},
                         {"model", g.model},
                         {"model_digest", model.digest},
                         {"model_version", d.group.version_start},
                         {"prompt", dataset[p].prompt},
                         {"tokens", s.tokens},
                         {"text", s.text ? Json(*s.text) : Json(nullptr)},
                         {"reward", s.reward ? Json(*s.reward) : Json(nullptr)}};
          if (!keep) record.erase("tokens");
          WEFT_RETURN_IF_ERROR(
              output.Add(keep ? "part" : "rejected", p, sample,
                         record.dump(-1, ' ', false, Json::error_handler_t::replace)));
          ++written;
        }
      }
      if (in_flight[p]) {
        in_flight[p] = false;
        --jobs_out;
      }
      if (!missing(p).empty()) queue.push_back(p);
    }
    // Durable before the next request acknowledges the batch.
    WEFT_RETURN_IF_ERROR(output.Sync());
    if (written > 0 && !first_record) first_record = Clock::now();
    // Jobs the orchestrator no longer holds (given up after their attempts, or added by a request
    // whose answer was lost and that never arrived): their prompts are asked again.
    if (Clock::now() - last_check > std::chrono::seconds(10) && jobs_out > 0) {
      last_check = Clock::now();
      Result<orchestrator::wire::StatusPage> status = client.GetStatus();
      if (status.ok() && status->jobs.queued + status->jobs.leased + status->trajectories.buffered +
                                 status->trajectories.outstanding ==
                             0) {
        WEFT_LOG(kWarning) << "generate: " << jobs_out
                           << " jobs are not at the orchestrator; asking for their prompts again";
        for (size_t p = 0; p < dataset.size(); ++p) {
          if (in_flight[p]) {
            in_flight[p] = false;
            queue.push_back(p);
          }
        }
        jobs_out = 0;
      }
    }
    if (Clock::now() - last_line >= std::chrono::seconds(tty ? 1 : 5)) {
      last_line = Clock::now();
      const double elapsed =
          first_record ? std::chrono::duration<double>(Clock::now() - *first_record).count() : 0;
      const double rate = elapsed > 0 ? static_cast<double>(written) / elapsed : 0;
      const uint64_t left = total - output.records();
      const std::string eta = rate > 0 ? Duration(static_cast<double>(left) / rate) : "-";
      std::printf(
          "%s[%5.0fs] %llu/%llu samples (%.1f%%), %.1f samples/s, ETA %s%s", tty ? "\r\033[K" : "",
          std::chrono::duration<double>(Clock::now() - started).count(),
          static_cast<unsigned long long>(output.records()), static_cast<unsigned long long>(total),
          100.0 * static_cast<double>(output.records()) / static_cast<double>(total), rate,
          eta.c_str(), tty ? "" : "\n");
      std::fflush(stdout);
    }
  }
  if (tty) std::printf("\n");
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  const double steady =
      first_record ? std::chrono::duration<double>(Clock::now() - *first_record).count() : 0;
  if (output.records() == total) {
    (void)client.AcknowledgeBatches();
    WEFT_RETURN_IF_ERROR(output.Finish());
  }
  StopWorkers(supervisor, children, processes.first_worker);
  StopInfrastructure(supervisor, children, processes.first_worker);
  Json restarts = Json::object();
  for (const Child& c : children) {
    if (c.restarts > 0) restarts[c.name] = c.restarts;
  }
  const Json report = {{"config", config_abs},
                       {"output", IsS3(g.output) ? g.output : fs::absolute(g.output).string()},
                       {"shards_uploaded", output.uploaded()},
                       {"model", g.model},
                       {"model_digest", model.digest},
                       {"model_version", model.version},
                       {"completed", output.records() == total},
                       {"samples_total", total},
                       {"samples_before", done_before},
                       {"samples_written", written},
                       {"records_kept", output.kept()},
                       {"records_rejected", output.records() - output.kept()},
                       {"duplicates_skipped", duplicates},
                       {"seconds", seconds},
                       {"samples_per_second",
                        steady > 0 ? Json(static_cast<double>(written) / steady) : Json(nullptr)},
                       {"restarts", restarts}};
  WEFT_RETURN_IF_ERROR(
      WriteTextFileAtomic((dir / "generate-report.json").string(), report.dump(2) + "\n"));
  std::printf(
      "%llu of %llu samples in %s (%llu kept, %llu rejected); %llu written in %.1f s "
      "(%.1f samples/s once the first arrived), %llu repeats skipped; report: %s\n",
      static_cast<unsigned long long>(output.records()), static_cast<unsigned long long>(total),
      g.output.c_str(), static_cast<unsigned long long>(output.kept()),
      static_cast<unsigned long long>(output.records() - output.kept()),
      static_cast<unsigned long long>(written), seconds,
      steady > 0 ? static_cast<double>(written) / steady : 0.0,
      static_cast<unsigned long long>(duplicates), (dir / "generate-report.json").string().c_str());
  if (interrupted)
    return Unavailable("interrupted; what was written stays, and running again resumes");
  if (!failure.empty()) return Internal(failure);
  return Status::Ok();
}

}  // namespace

void RegisterGenerate(CLI::App& app, Action* action) {
  auto config = std::make_shared<std::string>();
  CLI::App* g = app.add_subcommand(
      "generate",
      "Generate a dataset with a fixed model on the run's fleet: every (prompt, sample) of a "
      "JSONL dataset written once to sharded JSONL; run again to resume (its generate: section)");
  g->add_option("config", *config, "the run's YAML config")->required()->check(CLI::ExistingFile);
  g->callback([config, action] { *action = [config] { return RunGenerate(*config); }; });
}

}  // namespace weft::cli
