// The JSONL prompt dataset: good files read in order with their metadata, bad lines named by file
// and line.
#include "trainer_adapter/dataset.h"

#include <doctest/doctest.h>

#include <fstream>

#include "tests/temp_path.h"

namespace weft::trainer_adapter {
namespace {

using Json = nlohmann::json;

std::string Write(const std::string& name, const std::string& text) {
  const std::string path = testing::TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST_CASE("prompt dataset: one prompt per line, in order, with samples and metadata") {
  const std::string path =
      Write("dataset_good.jsonl",
            "\xEF\xBB\xBF{\"prompt\": \"12+34=\", \"metadata\": {\"answer\": "
            "\"46\", \"row\": 1}}\n"
            "\n"
            "   \n"
            "{\"prompt\": [13, 1, 10, 2, 11], \"samples\": 3}\r\n"
            "{\"samples\": 1, \"prompt\": \"5+5=\", \"metadata\": null}\n"
            "{\"prompt\": \"7+0=\", \"metadata\": [1, \"two\", {\"3\": 4.5}]}");
  Result<std::vector<DatasetPrompt>> read = ReadPromptDataset(path);
  REQUIRE_MESSAGE(read.ok(), read.status().ToString());
  REQUIRE(read->size() == 4);
  const std::vector<DatasetPrompt>& rows = *read;
  CHECK(rows[0].prompt == "12+34=");
  CHECK(!rows[0].samples);
  CHECK(rows[0].metadata == Json{{"answer", "46"}, {"row", 1}});
  CHECK(rows[0].line == 1);
  CHECK(rows[1].prompt == Json::array({13, 1, 10, 2, 11}));
  CHECK(rows[1].samples == 3u);
  CHECK(rows[1].metadata.is_null());
  CHECK(rows[1].line == 4);
  CHECK(rows[2].prompt == "5+5=");
  CHECK(rows[2].metadata.is_null());  // null: none
  CHECK(rows[3].metadata == Json::array({1, "two", {{"3", 4.5}}}));
  CHECK(rows[3].line == 6);
  // As jobs: the line's samples, else the trainer's.
  const orchestrator::NewJob first = rows[0].Job(8), second = rows[1].Job(8);
  CHECK(first.prompt == "12+34=");
  CHECK(first.samples == 8);
  CHECK(first.metadata == rows[0].metadata);
  CHECK(second.samples == 3);
  CHECK(second.metadata.is_null());
}

TEST_CASE("prompt dataset: a bad line is an error naming the file and the line") {
  auto error = [](const std::string& line) {
    const std::string path = Write("dataset_bad.jsonl", "{\"prompt\": \"1+1=\"}\n\n" + line + "\n");
    Result<std::vector<DatasetPrompt>> read = ReadPromptDataset(path);
    REQUIRE(!read.ok());
    CHECK(read.status().code() == StatusCode::kInvalidArgument);
    const std::string message = read.status().message();
    CHECK(message.rfind(path + ":3: ", 0) == 0);
    return message.substr(path.size() + 4);
  };
  CHECK(error("{\"prompt\": \"1+1=\"").rfind("not valid JSON: ", 0) == 0);
  CHECK(error("{\"prompt\": \"1+1=\", \"prompt\": \"2+2=\"}").find("a key repeated") !=
        std::string::npos);
  CHECK(error("[\"1+1=\"]") == "a line is a JSON object {\"prompt\": ...}, not array");
  CHECK(error("{\"samples\": 2}") == "the line lacks the field 'prompt'");
  CHECK(error("{\"prompt\": \"1+1=\", \"answer\": 2}") == "the line has an unknown field 'answer'");
  CHECK(error("{\"prompt\": \"\"}") == "the prompt is empty");
  CHECK(error("{\"prompt\": \"1+1=\", \"id\": -3}") ==
        "id must be a non-empty string (at most 1024 bytes) or a non-negative integer, not -3");
  CHECK(error("{\"prompt\": 12}") ==
        "prompt must be text (a non-empty string) or token ids (a non-empty array of "
        "non-negative integers), not number");
  CHECK(error("{\"prompt\": []}").find("not array") != std::string::npos);
  CHECK(error("{\"prompt\": [1, -2]}") ==
        "prompt[1] is not a token id (an integer from 0 to 2147483647)");
  CHECK(error("{\"prompt\": [1, 2.0]}") ==
        "prompt[1] is not a token id (an integer from 0 to 2147483647)");
  CHECK(error("{\"prompt\": \"1+1=\", \"samples\": 0}") ==
        "samples must be an integer from 1 to 4096, not 0");
  CHECK(error("{\"prompt\": \"1+1=\", \"samples\": 4097}") ==
        "samples must be an integer from 1 to 4096, not 4097");
  CHECK(error("{\"prompt\": \"1+1=\", \"samples\": \"2\"}") ==
        "samples must be an integer from 1 to 4096, not \"2\"");
  CHECK(error("{\"prompt\": \"1+1=\", \"metadata\": \"" + std::string(70000, 'x') + "\"}") ==
        "metadata is 70002 bytes of JSON text; at most 65536 (64 KiB)");
  CHECK(error("{\"prompt\": \"1+\xff=\"}").find("not valid JSON") != std::string::npos);
  std::string deep = "{\"prompt\": \"1+1=\", \"metadata\": ";
  for (int i = 0; i < 62; ++i) deep += "[";
  for (int i = 0; i < 62; ++i) deep += "]";
  CHECK(error(deep + "}").find("not valid JSON") != std::string::npos);
}

TEST_CASE("prompt dataset: a missing or empty file") {
  const std::string missing = testing::TempPath("dataset_missing.jsonl");
  Result<std::vector<DatasetPrompt>> read = ReadPromptDataset(missing);
  CHECK(read.status().code() == StatusCode::kNotFound);
  CHECK(read.status().message() ==
        "cannot read the prompt dataset " + missing + ": No such file or directory");
  const std::string empty = Write("dataset_empty.jsonl", "\n  \n");
  read = ReadPromptDataset(empty);
  CHECK(read.status().code() == StatusCode::kInvalidArgument);
  CHECK(read.status().message() == empty + ": the prompt dataset holds no prompt");
}

TEST_CASE("prompt dataset: lines and files are read within bounds, whatever the file is") {
  // /dev/zero has no line end: refused once a line passes the limit, not read without end.
  Result<std::vector<DatasetPrompt>> zero =
      ReadPromptDataset("/dev/zero", LineLimits{1 << 20, uint64_t{1} << 30});
  CHECK(zero.status().code() == StatusCode::kInvalidArgument);
  CHECK(zero.status().message() ==
        "/dev/zero:1: a line longer than 1048576 bytes, the limit for the prompt dataset");
  const std::string line = "{\"prompt\": \"" + std::string(2000, 'x') + "\"}\n";
  const std::string path = Write("dataset_bounds.jsonl", line + line + line);
  CHECK(ReadPromptDataset(path).value().size() == 3);
  CHECK(ReadPromptDataset(path, LineLimits{1500, 1 << 20}).status().message() ==
        path + ":1: a line longer than 1500 bytes, the limit for the prompt dataset");
  CHECK(ReadPromptDataset(path, LineLimits{1 << 20, 5000}).status().message() ==
        path + ": more than 5000 bytes, the limit for the prompt dataset");
  // The last line needs no line end; CRLF ends are taken.
  const std::string crlf =
      Write("dataset_crlf.jsonl", "{\"prompt\": \"a\"}\r\n{\"prompt\": \"b\"}");
  const auto prompts = ReadPromptDataset(crlf).value();
  REQUIRE(prompts.size() == 2);
  CHECK(prompts[1].prompt == "b");
  CHECK(prompts[1].line == 2);
}

}  // namespace
}  // namespace weft::trainer_adapter

namespace weft::trainer_adapter {
namespace {

TEST_CASE("prompt dataset: a line may carry an id, a string or a non-negative integer") {
  const std::string path =
      Write("dataset_ids.jsonl",
            "{\"id\": \"a-1\", \"prompt\": \"1+1=\"}\n{\"prompt\": \"2\", \"id\": 7}\n"
            "{\"prompt\": \"3\"}\n");
  Result<std::vector<DatasetPrompt>> read = ReadPromptDataset(path);
  REQUIRE(read.ok());
  CHECK((*read)[0].id == Json("a-1"));
  CHECK((*read)[1].id == Json(7));
  CHECK((*read)[2].id.is_null());
}

}  // namespace
}  // namespace weft::trainer_adapter
