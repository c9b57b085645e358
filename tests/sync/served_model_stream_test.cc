// A model assembled from a keyframe's pieces, in any order and from several threads, equals the
// one parsed from the whole file, digests included; bad and incomplete files are refused.
#include "sync/served_model_stream.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "sync/digest.h"
#include "tests/sync/test_util.h"

namespace weft::sync {
namespace {

// A safetensors file of tensors of every width, one of them empty, as a keyframe holds them.
std::vector<uint8_t> Keyframe(std::mt19937_64& rng) {
  struct Shape {
    const char* name;
    DType dtype;
    std::vector<uint64_t> shape;
  };
  const Shape shapes[] = {{"a.weight", DType::kBF16, {37, 11}}, {"b.scale", DType::kF32, {5}},
                          {"c.fp8", DType::kF8E4M3, {3, 333}},  {"d.empty", DType::kBF16, {0, 4}},
                          {"e.ids", DType::kI64, {9}},          {"f.flag", DType::kBool, {13}},
                          {"g.half", DType::kF16, {1001}}};
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorToWrite> tensors;
  for (const Shape& s : shapes) {
    uint64_t count = 1;
    for (uint64_t d : s.shape) count *= d;
    data.push_back(testing::RandomTensor(s.dtype, count, rng));
  }
  for (size_t i = 0; i < std::size(shapes); ++i)
    tensors.push_back({shapes[i].name, shapes[i].dtype, shapes[i].shape, data[i]});
  SafetensorsLayout layout = PlanSafetensors(tensors, {{"format", "pt"}}).value();
  std::vector<uint8_t> bytes = std::move(layout.header);
  for (size_t i : layout.order) bytes.insert(bytes.end(), data[i].begin(), data[i].end());
  return bytes;
}

// Cuts `size` bytes into pieces of 1 to `max_piece` bytes: (offset, length), shuffled.
std::vector<std::pair<uint64_t, uint64_t>> Pieces(uint64_t size, uint64_t max_piece,
                                                  std::mt19937_64& rng) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (uint64_t at = 0; at < size;) {
    const uint64_t length = std::min<uint64_t>(size - at, 1 + rng() % max_piece);
    pieces.emplace_back(at, length);
    at += length;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  return pieces;
}

void CheckSame(const ServedModel& got, const ServedModel& expected) {
  REQUIRE(got.tensors().size() == expected.tensors().size());
  for (size_t t = 0; t < got.tensors().size(); ++t) {
    const ServedModel::Tensor& a = got.tensors()[t];
    const ServedModel::Tensor& b = expected.tensors()[t];
    CAPTURE(b.spec.name);
    CHECK(a.spec.name == b.spec.name);
    CHECK(a.spec.dtype == b.spec.dtype);
    CHECK(a.spec.shape == b.spec.shape);
    CHECK(a.bytes == b.bytes);
    CHECK(a.digest == b.digest);
    CHECK(a.digest == TensorDigest(a.spec.dtype, a.bytes));
  }
}

TEST_CASE("served model stream: pieces written in place through windows, across tensors too") {
  std::mt19937_64 rng(6);
  const std::vector<uint8_t> file = Keyframe(rng);
  const ServedModel expected =
      ServedModel::FromSafetensors(SafetensorsFile::Parse(file).value(), 1);
  const uint64_t data_start = SafetensorsFile::Parse(file)->data_start();
  for (uint64_t max_piece : {uint64_t{1}, uint64_t{5}, uint64_t{200}, uint64_t{5000}}) {
    CAPTURE(max_piece);
    ServedModelStream stream(file.size());
    // No window before the header has been read, nor over it.
    CHECK(stream.Windows(data_start, 1).empty());
    CHECK(stream.Place(0, std::span(file).first(data_start)).ok());
    CHECK(stream.Windows(0, 1).empty());
    CHECK(stream.Windows(data_start - 1, 2).empty());
    CHECK(stream.Windows(file.size() - 1, 2).empty());
    CHECK(stream.Placed(0, 1).code() == StatusCode::kInvalidArgument);
    const auto pieces = Pieces(file.size() - data_start, max_piece, rng);
    std::atomic<int> windows{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        for (size_t i = w; i < pieces.size(); i += 4) {
          const uint64_t offset = data_start + pieces[i].first, length = pieces[i].second;
          const std::span<const uint8_t> piece = std::span(file).subspan(offset, length);
          const std::vector<std::span<uint8_t>> spans = stream.Windows(offset, length);
          if (spans.empty()) {
            CHECK(stream.Place(offset, piece).ok());
            continue;
          }
          // The windows are exactly the piece's places, in order: written there, then announced.
          uint64_t at = 0;
          for (std::span<uint8_t> span : spans) {
            std::copy(piece.begin() + at, piece.begin() + at + span.size(), span.begin());
            at += span.size();
          }
          REQUIRE(at == length);
          CHECK(stream.Placed(offset, length).ok());
          windows.fetch_add(1);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(windows.load() > 0);
    Result<ServedModel> got = stream.Finish();
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    CheckSame(*got, expected);
  }
}

TEST_CASE("served model stream: pieces in any order, of any size, from several threads") {
  std::mt19937_64 rng(5);
  const std::vector<uint8_t> file = Keyframe(rng);
  const ServedModel expected =
      ServedModel::FromSafetensors(SafetensorsFile::Parse(file).value(), 1);
  for (uint64_t max_piece : {uint64_t{1}, uint64_t{3}, uint64_t{64}, uint64_t{1000}, file.size()}) {
    CAPTURE(max_piece);
    ServedModelStream stream(file.size());
    const auto pieces = Pieces(file.size(), max_piece, rng);
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        for (size_t i = w; i < pieces.size(); i += 4) {
          const auto [offset, length] = pieces[i];
          CHECK(stream.Place(offset, std::span(file).subspan(offset, length)).ok());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    Result<ServedModel> got = stream.Finish();
    REQUIRE_MESSAGE(got.ok(), got.status().ToString());
    CheckSame(*got, expected);
  }
}

TEST_CASE("served model stream: restarted midway, then fed again, gives the same model") {
  std::mt19937_64 rng(6);
  const std::vector<uint8_t> file = Keyframe(rng);
  const ServedModel expected =
      ServedModel::FromSafetensors(SafetensorsFile::Parse(file).value(), 1);
  ServedModelStream stream(file.size());
  std::vector<uint8_t> damaged = file;
  damaged[damaged.size() / 2] ^= 1;
  for (const auto& [offset, length] : Pieces(file.size() / 2 + 100, 50, rng))
    REQUIRE(stream.Place(offset, std::span(damaged).subspan(offset, length)).ok());
  stream.Restart();
  for (const auto& [offset, length] : Pieces(file.size(), 500, rng))
    REQUIRE(stream.Place(offset, std::span(file).subspan(offset, length)).ok());
  Result<ServedModel> got = stream.Finish();
  REQUIRE(got.ok());
  CheckSame(*got, expected);
}

TEST_CASE("served model stream: a bad header, bytes past the end and missing bytes are refused") {
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> file = Keyframe(rng);
  {
    ServedModelStream stream(file.size());
    const std::vector<uint8_t> eleven(11);
    CHECK(stream.Place(file.size() - 10, eleven).code() == StatusCode::kDataLoss);
  }
  {
    // A header naming a length past the file's end, once its first 8 bytes have arrived.
    std::vector<uint8_t> bad = file;
    bad[3] = 0x01;  // 16 MiB more
    ServedModelStream stream(bad.size());
    CHECK(stream.Place(4, std::span(bad).subspan(4, 4)).ok());
    const Status status = stream.Place(0, std::span(bad).first(4));
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message().find("exceeds the file size") != std::string::npos);
  }
  {
    // Not JSON: refused when the header's last byte arrives.
    std::vector<uint8_t> bad = file;
    bad[8] = 'x';
    ServedModelStream stream(bad.size());
    CHECK(stream.Place(100, std::span(bad).subspan(100, bad.size() - 100)).ok());
    const Status status = stream.Place(0, std::span(bad).first(100));
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK(status.message().find("not a JSON object") != std::string::npos);
  }
  {
    ServedModelStream stream(file.size());
    REQUIRE(stream.Place(0, std::span(file).first(file.size() - 3)).ok());
    const Result<ServedModel> got = stream.Finish();
    CHECK(got.status().code() == StatusCode::kDataLoss);
    CHECK(got.status().message().find("3 of the file's") != std::string::npos);
  }
  {
    ServedModelStream stream(file.size());
    REQUIRE(stream.Place(20, std::span(file).subspan(20, 5)).ok());
    const Result<ServedModel> got = stream.Finish();
    CHECK(got.status().message().find("nor has its whole header") != std::string::npos);
  }
  {
    const std::vector<uint8_t> tiny = {1, 2, 3};
    ServedModelStream stream(tiny.size());
    CHECK(stream.Place(0, tiny).code() == StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace weft::sync
