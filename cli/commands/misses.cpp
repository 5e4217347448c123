// Why did it miss (core/misses.hpp): why, misses, and the sizing lines of stats.

#include <fmt/core.h>

#include "commands.hpp"
#include "kcache/core/misses.hpp"
#include "kcache/core/roles.hpp"
#include "kcache/core/units.hpp"
#include "kcache/remote/trust.hpp"

namespace kcache::cli {
namespace {

nlohmann::json miss_json(const core::Miss& m) {
    nlohmann::json fields = nlohmann::json::array();
    for (const auto& f : m.fields) {
        fields.push_back(
            {{"file", f.file}, {"field", f.field}, {"before", f.before}, {"after", f.after}});
    }
    nlohmann::json lines = nlohmann::json::array();
    for (const auto& l : m.lines) {
        lines.push_back(
            {{"file", l.file}, {"line", l.line}, {"before", l.before}, {"after", l.after}});
    }
    nlohmann::json out = {
        {"seq", m.seq},
        {"time_ns", m.time_ns},
        {"entry", m.name},
        {"producer", std::string(core::producer_name(m.producer))},
        {"family", m.family},
        {"cause", std::string(core::miss_cause_name(m.cause))},
        {"stored_bytes", m.stored_bytes},
        {"compared_with",
         m.compared_name.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.compared_name)},
        {"fields", std::move(fields)},
        {"lines", std::move(lines)},
        // Another node's entry, from its family member in the shared tier (null: local).
        {"compared_remote",
         m.compared_host.empty() && m.compared_namespace.empty()
             ? nlohmann::json(nullptr)
             : nlohmann::json{{"host", m.compared_host}, {"namespace", m.compared_namespace}}},
    };
    if (!m.same_binary.empty()) out["same_binary"] = m.same_binary;
    if (m.gone_ns) {
        out["gone_ns"] = m.gone_ns;
        out["gone_why"] = m.gone_why;
    }
    if (m.stack_distance) out["stack_distance"] = m.stack_distance;
    if (!m.note.empty()) out["note"] = m.note;
    return out;
}

// Where the entry compared with is: this cache, or another node's via the shared tier.
std::string where(const core::Miss& m) {
    if (m.compared_namespace.empty()) return "is in the cache";
    return fmt::format("is in the shared tier (pushed by {}, namespace {})",
                       m.compared_host.empty() ? "an unnamed host" : m.compared_host,
                       m.compared_namespace);
}

// The cause in a sentence, for people.
std::string summary(const core::Store& store, const core::Miss& m) {
    switch (m.cause) {
        case core::MissCause::first:
            return m.family.empty() ? "first: no entry like it was ever stored"
                                    : fmt::format("first: no entry of {} in the cache", m.family);
        case core::MissCause::capacity: {
            std::string s = fmt::format("capacity: this entry was {} {}", m.gone_why,
                                        age_since(store, m.gone_ns));
            if (m.stack_distance) {
                s += fmt::format("; a bound of at least {} would have kept it",
                                 core::format_size(m.stack_distance));
            }
            return s;
        }
        case core::MissCause::changed_key:
            return fmt::format("changed key: {} {} and its key differs", m.compared_name, where(m));
        case core::MissCause::unstable_key:
            return fmt::format(
                "unstable key: {}{} holds the same binary ({}) under another key: the "
                "compile was wasted",
                m.compared_name,
                m.compared_namespace.empty() ? std::string() : " (" + where(m).substr(3) + ")",
                m.same_binary);
    }
    return "unknown";
}

void print_miss(const core::Store& store, const core::Miss& m) {
    Table info({"", ""});
    info.add({"entry", m.name});
    info.add({"missed", age_since(store, m.time_ns)});
    info.add({"producer", std::string(core::producer_name(m.producer))});
    info.add({"family", m.family.empty() ? "- (its files name no kernel)" : m.family});
    info.add({"cause", summary(store, m)});
    if (m.cause == core::MissCause::capacity && !m.compared_name.empty())
        info.add({"same family", m.compared_name});
    if (!m.note.empty()) info.add({"note", m.note});
    info.print();
    if (!m.fields.empty()) {
        fmt::print("\nmetadata fields that differ ({} -> this entry)\n", m.compared_name);
        Table t({"FILE", "FIELD", "BEFORE", "AFTER"});
        for (const auto& f : m.fields) t.add({f.file, f.field, f.before, f.after});
        t.print();
    }
    if (!m.lines.empty()) {
        fmt::print("\nfiles that differ (first differing line; - {}, + this entry)\n",
                   m.compared_name);
        for (const auto& l : m.lines) {
            if (l.line) {
                fmt::print("  {} line {}\n    - {}\n    + {}\n", l.file, l.line, l.before, l.after);
            } else {
                fmt::print("  {}\n    - {}\n    + {}\n", l.file, l.before, l.after);
            }
        }
    }
}

// Classifies what is pending when asked to; else says how many wait.
void classify_or_tell(const Cli& cli, bool classify, std::unique_ptr<core::Store>& store) {
    if (classify) {
        auto writer = open_store(cli, Access::write);
        // Batch after batch (each compares for a few ms) until none classifies more.
        while (check(core::classify_pending(*writer, 1 << 20), "classify") > 0) {
        }
    }
    store = open_store(cli, Access::read);
}

struct WhyOptions {
    std::string target;
    bool json = false;
    bool classify = false;
};

// An entry name, a unique prefix of one, or a path whose tail names a node in the db
// (a path on the mount: /mnt/kcache/triton/ABC.../add_kernel.cubin).
std::string entry_name_of(const core::Txn& txn, const std::string& target) {
    // An entry evicted since its miss: its record is gone, its miss is kept.
    if (check(core::find_miss(txn, target))) return target;
    std::string_view rest = target;
    while (rest.starts_with('/')) rest.remove_prefix(1);
    while (!rest.empty() && rest.find('/') != std::string_view::npos) {
        if (auto ino = txn.resolve(rest)) {
            auto attr = check(txn.getattr(*ino));
            if (attr.entry) return check(txn.entry(attr.entry)).name;
        }
        rest.remove_prefix(rest.find('/') + 1);
    }
    if (auto ino = txn.resolve(rest); ino && target.find('/') != std::string::npos) {
        auto attr = check(txn.getattr(*ino));
        if (attr.entry) return check(txn.entry(attr.entry)).name;
    }
    return find_entry(txn, target).name;
}

// The shared tier held the entry and a pull refused it (remote/trust.hpp's rejections):
// the cause in a sentence.
std::string refused(const core::Store& store, const remote::RejectionRecord& r) {
    return fmt::format("the shared tier held it and a pull refused it {} ({}): {}",
                       age_since(store, r.time_ns), r.cause, r.detail);
}
nlohmann::json refused_json(const remote::RejectionRecord& r) {
    return {{"cause", r.cause}, {"detail", r.detail}, {"time_ns", r.time_ns}};
}

int run_why(const Cli& cli, const WhyOptions& opts) {
    std::unique_ptr<core::Store> store;
    classify_or_tell(cli, opts.classify, store);
    auto txn = check(store->read());
    std::string name;
    try {
        name = entry_name_of(txn, opts.target);
    } catch (const Failure&) {
        // Not here at all (nothing compiled it here yet): it may still have been refused.
        auto r = remote::last_rejection(store->path(), opts.target);
        if (!r) throw;
        if (opts.json) {
            print_json({{"entry", r->entry},
                        {"cause", "remote_rejected"},
                        {"remote_rejected", refused_json(*r)}});
        } else {
            Table info({"", ""});
            info.add({"entry", r->entry});
            info.add({"cause", refused(*store, *r) + "; nothing of it was stored"});
            info.print();
        }
        return kExitOk;
    }
    const auto rejection = remote::last_rejection(store->path(), name);
    auto miss = check(core::find_miss(txn, name));
    if (!miss) {
        // An entry the shared tier supplied missed nowhere here: say whose compile it is.
        if (auto entry = txn.find_entry(name); entry && core::is_fleet_entry(*entry)) {
            const std::string writer = entry->populated_by_name.substr(core::kFleetOrigin.size());
            if (opts.json) {
                print_json({{"entry", entry->name},
                            {"cause", "fleet"},
                            {"writer", writer},
                            {"fetched_ns", entry->created_ns},
                            {"hits", entry->hits}});
            } else {
                Table info({"", ""});
                info.add({"entry", entry->name});
                info.add({"cause", fmt::format("fleet hit: compiled on {}, pulled from the shared "
                                               "tier {}: no miss here",
                                               writer.empty() ? "another node" : writer,
                                               age_since(*store, entry->created_ns))});
                info.add({"hits", std::to_string(entry->hits)});
                info.print();
            }
            return kExitOk;
        }
        if (rejection) {
            if (opts.json) {
                print_json({{"entry", name},
                            {"cause", "remote_rejected"},
                            {"remote_rejected", refused_json(*rejection)}});
            } else {
                fmt::print("{}: {}\n", name, refused(*store, *rejection));
            }
            return kExitOk;
        }
        const auto pending = check(core::pending_misses(txn));
        throw Failure(fmt::format(
            "no classified miss of {} is kept{}", name,
            pending ? fmt::format(" ({} not classified yet: kcache-fsd classifies a miss once "
                                  "its entry settled; `kcache why --classify` does it now)",
                                  count(pending, "miss is", "misses are"))
                    : std::string()));
    }
    if (opts.json) {
        nlohmann::json out = miss_json(*miss);
        if (rejection) out["remote_rejected"] = refused_json(*rejection);
        print_json(out);
    } else {
        print_miss(*store, *miss);
        // Why the shared tier did not answer it: refused by the trust policy.
        if (rejection) fmt::print("\nshared tier: {}\n", refused(*store, *rejection));
    }
    return kExitOk;
}

struct MissesOptions {
    std::optional<std::int64_t> since_ns;
    std::string cause;
    bool json = false;
    bool classify = false;
};

int run_misses(const Cli& cli, const MissesOptions& opts) {
    std::optional<core::MissCause> cause;
    if (!opts.cause.empty()) {
        cause = core::parse_miss_cause(opts.cause);
        if (!cause) {
            throw UsageError(fmt::format(
                "--cause {}: not first, capacity, changed_key or unstable_key", opts.cause));
        }
    }
    std::unique_ptr<core::Store> store;
    classify_or_tell(cli, opts.classify, store);
    auto txn = check(store->read());
    const std::int64_t since = opts.since_ns ? store->now_ns() - *opts.since_ns : 0;
    std::vector<core::Miss> misses;
    check(core::for_each_miss(txn, since, [&](const core::Miss& m) {
        if (!cause || m.cause == *cause) misses.push_back(m);
        return true;
    }));
    const auto pending = check(core::pending_misses(txn));
    if (opts.json) {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& m : misses) list.push_back(miss_json(m));
        print_json({{"misses", std::move(list)}, {"pending", pending}});
        return kExitOk;
    }
    Table table({"WHEN", "CAUSE", "ENTRY", "FAMILY", "EVIDENCE"});
    for (const auto& m : misses) {
        std::string evidence;
        if (m.cause == core::MissCause::capacity) {
            evidence = fmt::format("{} {}", m.gone_why.substr(0, m.gone_why.find(' ')),
                                   age_since(*store, m.gone_ns));
        } else if (!m.fields.empty()) {
            evidence = fmt::format("{}: {} -> {}", m.fields[0].field, m.fields[0].before,
                                   m.fields[0].after);
            if (m.fields.size() > 1) evidence += fmt::format(" (+{} fields)", m.fields.size() - 1);
        } else if (!m.same_binary.empty()) {
            evidence = "same " + m.same_binary + " as " + m.compared_name;
        } else if (!m.lines.empty()) {
            evidence = m.lines[0].line ? fmt::format("{} line {}", m.lines[0].file, m.lines[0].line)
                                       : m.lines[0].file + " differs";
        }
        table.add({age_since(*store, m.time_ns), std::string(core::miss_cause_name(m.cause)),
                   m.name, m.family.empty() ? "-" : m.family, evidence});
    }
    if (table.empty()) {
        fmt::print("no classified misses{}\n", opts.since_ns ? " in that time" : "");
    } else {
        table.print();
    }
    if (pending) fmt::print("({} not classified yet)\n", count(pending, "miss", "misses"));
    return kExitOk;
}

}  // namespace

nlohmann::json sizing_json(const core::Store& store, const core::Txn& txn) {
    const std::int64_t day = std::int64_t{86400} * 1'000'000'000;
    nlohmann::json out;
    for (const auto& [label, since] :
         {std::pair<const char*, std::int64_t>{"last_day", store.now_ns() - day}, {"all", 0}}) {
        const core::Sizing s = check(core::capacity_sizing(txn, since));
        nlohmann::json curve = nlohmann::json::array();
        for (const auto& p : s.curve) {
            curve.push_back({{"bytes", p.bytes}, {"capacity_misses", p.capacity_misses}});
        }
        out[label] = {{"misses", s.misses},
                      {"capacity_misses", s.capacity},
                      {"bound", s.bound},
                      {"avoid_all_bytes", s.avoid_all},
                      {"curve", std::move(curve)}};
    }
    return out;
}

void print_sizing(const core::Store& store, const core::Txn& txn) {
    const std::int64_t day = std::int64_t{86400} * 1'000'000'000;
    const core::Sizing s = check(core::capacity_sizing(txn, store.now_ns() - day));
    const core::Sizing all = check(core::capacity_sizing(txn, 0));
    if (all.misses == 0) return;
    fmt::print("\nsizing (classified misses: last day {}, all kept {})\n", s.misses, all.misses);
    const core::Sizing& use = s.capacity ? s : all;
    fmt::print("  capacity misses  {} in the last day, {} of all kept\n", s.capacity, all.capacity);
    if (use.capacity == 0) return;
    if (use.avoid_all) {
        fmt::print("  a bound of {} would have avoided them all (LRU stack distance, {})\n",
                   core::format_size(use.avoid_all), s.capacity ? "last day" : "all kept");
    }
    Table t({"  BOUND", "CAPACITY MISSES LEFT"}, {false, true});
    for (const auto& p : use.curve) {
        t.add({"  " + core::format_size(p.bytes) + (p.bytes == use.bound ? " (now)" : ""),
               std::to_string(p.capacity_misses)});
    }
    t.print();
}

void add_misses_commands(CLI::App& app, Cli& cli) {
    {
        auto opts = std::make_shared<WhyOptions>();
        auto* sub = app.add_subcommand(
            "why", "why an entry missed: the cause, the entry compared with, the difference");
        sub->add_option("ENTRY", opts->target,
                        "an entry name (or unique prefix), or a path of one of its files "
                        "(on the mount)")
            ->required();
        sub->add_flag("--json", opts->json, "print as JSON");
        sub->add_flag("--classify", opts->classify,
                      "classify pending misses first (what kcache-fsd does in the background)");
        on_run(sub, cli, opts, &run_why);
    }
    {
        auto opts = std::make_shared<MissesOptions>();
        auto* sub = app.add_subcommand("misses", "recent misses with their causes, newest first");
        sub->add_option("--since", opts->since_ns, "only misses this recent, e.g. 1h")
            ->type_name("AGE")
            ->transform(duration_transform());
        sub->add_option("--cause", opts->cause,
                        "only this cause: first, capacity, changed_key, unstable_key")
            ->type_name("CAUSE");
        sub->add_flag("--json", opts->json, "print as JSON");
        sub->add_flag("--classify", opts->classify,
                      "classify pending misses first (what kcache-fsd does in the background)");
        on_run(sub, cli, opts, &run_misses);
    }
}

}  // namespace kcache::cli
