#include "sync/safetensors.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

std::vector<uint8_t> FileBytes(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> bytes(8 + json.size() + data_bytes, 0);
  uint64_t n = json.size();
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  return bytes;
}

std::string ParseError(const std::string& json, size_t data_bytes) {
  std::vector<uint8_t> bytes = FileBytes(json, data_bytes);
  Result<SafetensorsFile> file = SafetensorsFile::Parse(bytes);
  REQUIRE(!file.ok());
  CHECK(file.status().code() == StatusCode::kDataLoss);
  return file.status().message();
}

TEST_CASE("the writer produces the reference layout byte for byte") {
  std::vector<uint8_t> a(2 * 3 * 4, 1), b(4 * 2, 2);
  std::vector<TensorToWrite> tensors = {{"b", DType::kBF16, {4}, b}, {"a", DType::kF32, {2, 3}, a}};
  Result<SafetensorsLayout> layout = PlanSafetensors(tensors, {{"format", "pt"}});
  REQUIRE(layout.ok());
  std::string expected =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";
  expected.append((8 - expected.size() % 8) % 8, ' ');
  std::string header(layout->header.begin() + 8, layout->header.end());
  CHECK(header == expected);
  CHECK(layout->header.size() % 8 == 0);
  CHECK(layout->order == std::vector<size_t>{1, 0});  // F32 before BF16
}

TEST_CASE("write then read: every dtype, metadata, tensor data") {
  std::mt19937_64 rng(21);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  for (DType dtype : testing::kAllDTypes) {
    storage.push_back(testing::RandomTensor(dtype, 12, rng));
    tensors.push_back(
        {"t." + std::string(Info(dtype).safetensors_name), dtype, {3, 4}, storage.back()});
  }
  tensors.push_back({"empty", DType::kF32, {0}, {}});
  std::string path =
      std::filesystem::temp_directory_path() / ("weft_st_" + std::to_string(getpid()));
  REQUIRE(WriteSafetensors(path, tensors, {{"step", "7"}}).ok());
  Result<SafetensorsFile> file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK(file->metadata().at("step") == "7");
  CHECK(file->tensors().size() == tensors.size());
  for (const TensorToWrite& t : tensors) {
    const SafetensorsTensor* read = file->Find(t.name);
    REQUIRE(read != nullptr);
    CHECK(read->dtype == t.dtype);
    CHECK(read->shape == t.shape);
    CHECK(std::equal(read->data.begin(), read->data.end(), t.data.begin(), t.data.end()));
    CHECK((file->data_start() + read->data_offset) % Info(t.dtype).size == 0);
  }
  std::filesystem::remove(path);
  CHECK(SafetensorsFile::Open(path).status().code() == StatusCode::kNotFound);
  CHECK(SafetensorsFile::Open(path).status().message().find(path) != std::string::npos);
}

TEST_CASE("malformed files are rejected with a message that names the problem") {
  CHECK(ParseError(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)
            .find("outside the data") != std::string::npos);
  CHECK(ParseError(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)
            .find("need 12 bytes") != std::string::npos);
  CHECK(ParseError(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8)
            .find("unsupported dtype 'Q7'") != std::string::npos);
  CHECK(ParseError(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)
            .find("negative") != std::string::npos);
  CHECK(
      ParseError(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          12)
          .find("gap or overlap") != std::string::npos);
  CHECK(ParseError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8)
            .find("cover 4 of 8") != std::string::npos);
  CHECK(
      ParseError(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8)
          .find("twice") != std::string::npos);
  CHECK(ParseError(R"({"__metadata__":{"k":1}})", 0).find("not a string") != std::string::npos);
  CHECK(ParseError(R"([1,2])", 0).find("not a JSON object") != std::string::npos);
  CHECK(ParseError(R"({"a":)", 0).find("not valid JSON") != std::string::npos);
  std::vector<uint8_t> short_file = {1, 2, 3};
  CHECK(SafetensorsFile::Parse(short_file).status().message().find("too short") !=
        std::string::npos);
  std::vector<uint8_t> huge = FileBytes("{}", 0);
  huge[5] = 1;  // header length > file size
  CHECK(SafetensorsFile::Parse(huge).status().message().find("exceeds") != std::string::npos);
}

}  // namespace
}  // namespace weft::sync
