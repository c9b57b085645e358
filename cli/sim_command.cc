// weft sim CONFIG: the simulator (sim/simulator.h; docs/sim.md).
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "common/file_util.h"
#include "common/units.h"
#include "sim/config.h"
#include "sim/report.h"
#include "sim/simulator.h"

namespace weft::cli {
namespace {

struct SimArgs {
  std::string config;
  std::optional<uint64_t> seed;
  uint64_t seeds = 0;
  std::string out;
  std::string variant;
  std::string max_memory = "8GiB";
};

Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) return Unavailable("cannot write " + path.string());
  return Status::Ok();
}

// One run: its reports in `dir` (report.json, report.svg, report.html are a function of the
// configuration and the seed; timing.json holds the real time it took).
Result<nlohmann::json> RunOne(const sim::SimConfig& config, const std::filesystem::path& dir,
                              bool print) {
  const auto start = std::chrono::steady_clock::now();
  const sim::SimResult result = sim::Simulate(config);
  const double real =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return Unavailable("cannot create " + dir.string() + ": " + error.message());
  WEFT_RETURN_IF_ERROR(WriteText(dir / "report.json", result.report.dump(1) + "\n"));
  WEFT_RETURN_IF_ERROR(WriteText(dir / "report.svg", sim::ReportSvg(result.report)));
  WEFT_RETURN_IF_ERROR(WriteText(dir / "report.html", sim::ReportHtml(result.report)));
  const nlohmann::json timing = {
      {"real_seconds", real},
      {"simulated_seconds", result.simulated_seconds},
      {"events", result.events},
      {"events_per_second", real > 0 ? static_cast<double>(result.events) / real : 0.0},
      {"core_seconds", result.core_seconds},
      {"invariant_checks", result.invariant_checks},
  };
  WEFT_RETURN_IF_ERROR(WriteText(dir / "timing.json", timing.dump(1) + "\n"));
  if (print) {
    std::cout << sim::SummaryText(result.report);
    std::printf(
        "  %.0f simulated seconds in %.2f real seconds (%.0fx), %.0f events/s, %.0f%% of "
        "it in the orchestrator core; reports in %s\n",
        result.simulated_seconds, real, real > 0 ? result.simulated_seconds / real : 0.0,
        real > 0 ? static_cast<double>(result.events) / real : 0.0,
        real > 0 ? 100 * result.core_seconds / real : 0.0, dir.string().c_str());
  }
  if (!result.failure.ok()) return result.failure;
  return result.report;
}

Status RunSim(const SimArgs& args) {
  WEFT_ASSIGN_OR_RETURN(sim::SimConfig config, sim::LoadSimConfig(args.config));
  if (args.seed) config.seed = *args.seed;
  // The runs: the configuration as written, then each variant (or only the one asked for).
  std::vector<std::pair<std::string, sim::SimConfig>> runs;
  for (auto& [name, run] : sim::Runs(config)) {
    if (args.variant.empty() || args.variant == name) runs.emplace_back(name, std::move(run));
  }
  if (runs.empty())
    return InvalidArgument("no variant named '" + args.variant + "' in " + args.config);
  // Refused before it starts, rather than found out when memory runs out.
  WEFT_ASSIGN_OR_RETURN(const uint64_t limit, ParseByteSize(args.max_memory));
  for (const auto& [name, run] : runs) {
    const sim::MemoryEstimate estimate = sim::EstimateMemory(run);
    if (estimate.bytes > static_cast<double>(limit)) {
      return InvalidArgument(
          args.config + (runs.size() > 1 ? " (" + name + ")" : "") + ": this run would hold " +
          estimate.Describe() + ", more than --max-memory " + args.max_memory +
          ": shorten duration (or trainer.steps), lower trainer.prompts_per_step or steps_ahead, "
          "or raise --max-memory");
    }
  }
  if (args.seeds > 0) {  // many seeds: the invariants only
    const auto start = std::chrono::steady_clock::now();
    uint64_t events = 0, checks = 0;
    for (auto& [name, run] : runs) {
      for (uint64_t s = 0; s < args.seeds; ++s) {
        run.seed = config.seed + s;
        const sim::SimResult result = sim::Simulate(run);
        events += result.events;
        checks += result.invariant_checks;
        if (!result.failure.ok()) return result.failure.WithContext(name);
      }
    }
    const double real =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %zu run(s) x %" PRIu64 " seeds from %" PRIu64
                ": every invariant held (%" PRIu64 " events, %" PRIu64 " checks, %.1f s)\n",
                config.name.c_str(), runs.size(), args.seeds, config.seed, events, checks, real);
    return Status::Ok();
  }
  const std::filesystem::path out = args.out.empty() ? "runs/sim/" + config.name : args.out;
  if (runs.size() == 1) return RunOne(runs[0].second, out, true).status();
  std::vector<std::pair<std::string, nlohmann::json>> reports;
  nlohmann::json sweep = nlohmann::json::array();
  for (const auto& [name, run] : runs) {
    std::printf("== %s\n", name.c_str());
    WEFT_ASSIGN_OR_RETURN(nlohmann::json report, RunOne(run, out / name, true));
    sweep.push_back({{"run", name}, {"report", name + "/report.json"}});
    reports.emplace_back(name, std::move(report));
  }
  const std::string table = sim::SweepTable(reports);
  WEFT_RETURN_IF_ERROR(WriteText(out / "sweep.txt", table));
  WEFT_RETURN_IF_ERROR(WriteText(out / "sweep.json", sweep.dump(1) + "\n"));
  std::printf("\n%s\n(%s)\n", table.c_str(), (out / "sweep.txt").string().c_str());
  return Status::Ok();
}

}  // namespace

void RegisterSim(CLI::App& app, Action* action) {
  auto args = std::make_shared<SimArgs>();
  CLI::App* sim = app.add_subcommand(
      "sim",
      "Simulate a deployment (fleet, model, trainer, faults) driving the real orchestrator core "
      "and pull planner; checks the invariants on every event and writes report.json, "
      "report.svg and report.html (docs/sim.md)");
  sim->add_option("config", args->config, "The simulation's YAML file (configs/sim/)")
      ->required()
      ->check(CLI::ExistingFile);
  sim->add_option("--seed", args->seed, "The seed (default: the file's `seed`)");
  sim->add_option("--seeds", args->seeds,
                  "Run this many seeds from the seed, checking the invariants only (no reports)");
  sim->add_option("--out", args->out, "Where the reports go (default runs/sim/NAME)");
  sim->add_option("--variant", args->variant,
                  "Run only this variant of the file's `variants` (base: the file as written)");
  sim->add_option("--max-memory", args->max_memory,
                  "Refuse a run whose estimated peak memory is above this (default 8GiB)");
  sim->callback([args, action] { *action = [args] { return RunSim(*args); }; });
}

}  // namespace weft::cli
