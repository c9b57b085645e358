// A raw HTTP request for tests of weft's servers: sent exactly as given (no path normalisation,
// no proxy), for what well-behaved clients never send too.
#pragma once

#include <curl/curl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace weft::testing {

struct RawReply {
  long status = 0;  // 0: no answer
  std::vector<uint8_t> body;
  std::string text() const { return std::string(body.begin(), body.end()); }
};

inline RawReply Raw(const std::string& url, const std::string& method,
                    const std::vector<std::string>& headers = {}, const std::string& body = "") {
  RawReply reply;
  CURL* curl = curl_easy_init();
  curl_slist* list = nullptr;
  for (const auto& h : headers) list = curl_slist_append(list, h.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(curl, CURLOPT_PROXY, "");  // loopback, whatever the environment says
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty()) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* user) {
        auto* out = static_cast<std::vector<uint8_t>*>(user);
        out->insert(out->end(), data, data + size * count);
        return size * count;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  if (curl_easy_perform(curl) == CURLE_OK)
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  return reply;
}

}  // namespace weft::testing
