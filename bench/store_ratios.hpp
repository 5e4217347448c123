// kcache-bench-store's ratio table: each kcache case against its plain-file
// baseline, from the figures of the run (bench_store.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

namespace kcache::bench {

// Console output as usual, and each run's wall time per iteration and rates kept
// for the ratio table printed at the end.
class RatioReporter : public benchmark::ConsoleReporter {
  public:
    explicit RatioReporter(bool color) : ConsoleReporter(color ? OO_ColorTabular : OO_Tabular) {}
    struct Figures {
        double seconds = 0;  // wall time per iteration
        double items_per_second = 0;
    };
    void ReportRuns(const std::vector<Run>& runs) override {
        ConsoleReporter::ReportRuns(runs);
        for (const Run& run : runs) {
            if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
            Figures f;
            f.seconds = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
            if (auto it = run.counters.find("items_per_second"); it != run.counters.end()) {
                f.items_per_second = it->second.value;
            }
            m_figures[run.run_name.function_name] = f;
        }
    }
    const Figures* find(const std::string& name) const {
        auto it = m_figures.find(name);
        return it == m_figures.end() ? nullptr : &it->second;
    }

  private:
    std::map<std::string, Figures> m_figures;
};

// "1KiB", "8KiB": the size part of the cases' names.
std::string size_label(std::size_t size);
// Prints the table (stdout) from what `r` kept.
void print_ratios(const RatioReporter& r);

}  // namespace kcache::bench
