// The store API's endpoints for the fuzz targets of the store server and the relay (docs/api.md,
// "Store API" and "Relay"), the small run their store holds, and the $H placeholder.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "policy_store/directory_store.h"
#include "tests/fuzz/http_fuzz.h"

namespace weft::fuzz {

inline constexpr char kWriterToken[] = "fuzz-writer-token";

// A directory store at `root` holding run "r": a small and a large blob, version 0's manifest and
// `latest`. Aborts when it cannot be written.
std::unique_ptr<policy_store::DirectoryStore> OpenSeededStore(const std::string& root);

// The endpoints: reads go to server `read_server`, writes to `write_server` (the same server for
// a store server; the upstream store for a relay, which is read-only, so that the fuzzer can put
// blobs there and read them through the relay), each with seeds. Writes take the role "writer".
std::vector<Endpoint> StoreEndpoints(int read_server, int write_server);
std::vector<std::string> StoreRawSeeds();

// Replaces "$H" in the path with the SHA-256 of the body (in hex), so that a blob's key and bytes
// can agree whatever the fuzzer makes of the body.
void ExpandBlobHash(const Endpoint& endpoint, std::string* path, std::string* body);

}  // namespace weft::fuzz
