#include "trainer_adapter/dataset.h"

#include <climits>
#include <fstream>

#include "common/json_fields.h"
#include "common/json_text.h"
#include "orchestrator/types.h"

namespace weft::trainer_adapter {
namespace {

using Json = nlohmann::json;

// A line becomes one job of a POST /v1/jobs body, {"prompts": [<line>]}, whose nesting the
// orchestrator bounds at 64 counted from the body's top: a line may nest 62 deep.
constexpr size_t kMaxLineDepth = 62;

bool IsTokenId(const Json& id) {
  if (id.is_number_unsigned()) return id.get<uint64_t>() <= INT_MAX;
  return id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT_MAX;
}

Result<DatasetPrompt> ParseLine(std::string_view line, const std::string& where) {
  const std::string fault = json_text::Validate(line, kMaxLineDepth);
  if (!fault.empty()) return InvalidArgument(where + ": not valid JSON: " + fault);
  Json row = Json::parse(line.begin(), line.end(), nullptr, false);
  if (row.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  if (!row.is_object())
    return InvalidArgument(where + ": a line is a JSON object {\"prompt\": ...}, not " +
                           std::string(row.type_name()));
  WEFT_RETURN_IF_ERROR(
      CheckFields(row, "the line", {"prompt"}, {"samples", "metadata", "id"}).WithContext(where));
  DatasetPrompt entry;
  if (row.contains("id")) {
    const Json& id = row["id"];
    if (!(id.is_string() && !id.get<std::string>().empty() &&
          id.get<std::string>().size() <= 1024) &&
        !id.is_number_unsigned())
      return InvalidArgument(where +
                             ": id must be a non-empty string (at most 1024 bytes) or a "
                             "non-negative integer, not " +
                             id.dump());
    entry.id = id;
  }
  entry.prompt = std::move(row["prompt"]);
  const Json& prompt = entry.prompt;
  if (prompt.is_string()) {
    if (prompt.get<std::string>().empty()) return InvalidArgument(where + ": the prompt is empty");
  } else if (prompt.is_array() && !prompt.empty()) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (!IsTokenId(prompt[i])) {
        return InvalidArgument(where + ": prompt[" + std::to_string(i) +
                               "] is not a token id (an integer from 0 to " +
                               std::to_string(INT_MAX) + ")");
      }
    }
  } else {
    return InvalidArgument(where +
                           ": prompt must be text (a non-empty string) or token ids (a non-empty "
                           "array of non-negative integers), not " +
                           std::string(prompt.type_name()));
  }
  if (row.contains("samples")) {
    const Json& samples = row["samples"];
    if (!samples.is_number_unsigned() || samples.get<uint64_t>() < 1 ||
        samples.get<uint64_t>() > 4096) {
      return InvalidArgument(where + ": samples must be an integer from 1 to 4096, not " +
                             samples.dump());
    }
    entry.samples = static_cast<uint32_t>(samples.get<uint64_t>());
  }
  if (row.contains("metadata")) {
    entry.metadata = std::move(row["metadata"]);
    const size_t bytes = entry.metadata.dump().size();
    if (bytes > orchestrator::kMaxJobMetadataBytes) {
      return InvalidArgument(where + ": metadata is " + std::to_string(bytes) +
                             " bytes of JSON text; at most " +
                             std::to_string(orchestrator::kMaxJobMetadataBytes) + " (64 KiB)");
    }
  }
  return entry;
}

}  // namespace

Result<std::vector<DatasetPrompt>> ReadPromptDataset(const std::string& path,
                                                     const LineLimits& limits) {
  WEFT_ASSIGN_OR_RETURN(LineReader in, LineReader::Open(path, limits, "the prompt dataset"));
  std::vector<DatasetPrompt> prompts;
  while (true) {
    WEFT_ASSIGN_OR_RETURN(std::optional<std::string> next, in.Next());
    if (!next) break;
    std::string& line = *next;
    const uint64_t number = in.line();
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF line ends
    std::string_view text = line;
    if (number == 1 && text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
    if (text.find_first_not_of(" \t") == std::string_view::npos) continue;
    WEFT_ASSIGN_OR_RETURN(DatasetPrompt entry,
                          ParseLine(text, path + ":" + std::to_string(number)));
    entry.line = number;
    prompts.push_back(std::move(entry));
  }
  if (prompts.empty()) return InvalidArgument(path + ": the prompt dataset holds no prompt");
  return prompts;
}

}  // namespace weft::trainer_adapter
