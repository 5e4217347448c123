// kcache-inspector: a window onto a kcache db (docs/inspector.md).
//
// main() parses the command line, opens the model (before any window, so a wrong
// --db is a message and exit 1 even without a display), then runs the GLFW +
// OpenGL3 loop around gui::draw_inspector. With --screenshot it renders --frames
// frames, writes the last one to a PNG and exits; with --frames alone it exits after
// that many frames (benchmarks, tests). The window layout is kept in
// $XDG_CONFIG_HOME/kcache/inspector.ini (else ~/.config/kcache/inspector.ini);
// screenshots neither read nor write it, so they look the same everywhere.

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "kcache/core/store.hpp"
#include "kcache/gui/model.hpp"
#include "kcache/gui/panels.hpp"

#ifndef KCACHE_VERSION
#define KCACHE_VERSION "unknown"
#endif

namespace {

using namespace kcache;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

struct Options {
    std::string db;
    std::string screenshot;
    int frames = 0;  // 0: run until the window is closed
    bool report_frame_times = false;
    std::string size = "1600x1000";
    std::string select;
    std::string file;
    bool scan_duplicates = false;
    bool misses = false;
};

// The layout file, or "" when there is no config directory to keep it in.
std::string layout_path() {
    namespace fs = std::filesystem;
    fs::path dir;
    if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) {
        dir = fs::path(xdg) / "kcache";
    } else if (const char* home = std::getenv("HOME"); home && *home) {
        dir = fs::path(home) / ".config" / "kcache";
    } else {
        return {};
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
        std::fprintf(stderr, "kcache-inspector: note: layout not saved: %s: %s\n", dir.c_str(),
                     ec.message().c_str());
        return {};
    }
    return (dir / "inspector.ini").string();
}

// The back buffer as a PNG (rows flipped: OpenGL's first row is the bottom one).
bool write_png(const std::string& path, int width, int height) {
    std::vector<unsigned char> pixels(static_cast<std::size_t>(width) * height * 4);
    glPixelStorei(GL_PACK_ALIGNMENT, 1);
    glReadBuffer(GL_BACK);
    glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
    const std::size_t stride = static_cast<std::size_t>(width) * 4;
    std::vector<unsigned char> flipped(pixels.size());
    for (int y = 0; y < height; ++y) {
        std::copy_n(pixels.begin() + static_cast<std::ptrdiff_t>(y * stride), stride,
                    flipped.begin() + static_cast<std::ptrdiff_t>((height - 1 - y) * stride));
    }
    for (std::size_t i = 3; i < flipped.size(); i += 4) flipped[i] = 255;
    return stbi_write_png(path.c_str(), width, height, 4, flipped.data(),
                          static_cast<int>(stride)) != 0;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Frame times after the first two frames, which build the font atlas and settle the
// layout (not steady state): mean, median, p95 and max.
void report_frame_times(const char* what, const std::vector<double>& all) {
    std::vector<double> steady(all.begin() + 2, all.end());
    std::sort(steady.begin(), steady.end());
    double sum = 0;
    for (double ms : steady) sum += ms;
    fmt::print(
        "{}: {} frames (after 2 warm-up), mean {:.2f} ms, median {:.2f} ms, "
        "p95 {:.2f} ms, max {:.2f} ms; first frame {:.1f} ms\n",
        what, steady.size(), sum / static_cast<double>(steady.size()), steady[steady.size() / 2],
        steady[steady.size() * 95 / 100], steady.back(), all.front());
}

// The inspector's window with an OpenGL 3 context; null (said why) when there is none.
GLFWwindow* open_window(int width, int height, const std::string& db_path) {
    glfwSetErrorCallback([](int code, const char* what) {
        std::fprintf(stderr, "kcache-inspector: GLFW error %d: %s\n", code, what);
    });
    if (!glfwInit()) {
        std::fprintf(stderr, "kcache-inspector: cannot open a window (no display? DISPLAY=%s)\n",
                     std::getenv("DISPLAY") ? std::getenv("DISPLAY") : "");
        return nullptr;
    }
    glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
    glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
    const std::string title = "kcache inspector - " + db_path;
    GLFWwindow* window = glfwCreateWindow(width, height, title.c_str(), nullptr, nullptr);
    if (!window) {
        std::fprintf(stderr, "kcache-inspector: cannot create an OpenGL 3 window\n");
        glfwTerminate();
    }
    return window;
}

// Draws frames until the window closes, or until --frames; each frame's time (and the
// part without rendering) when reporting them. Returns the exit code.
int run_frames(GLFWwindow* window, gui::Model& model, gui::UiState& ui, const Options& opts,
               bool screenshot, std::vector<double>& frame_ms, std::vector<double>& ui_ms) {
    ImGuiIO& io = ImGui::GetIO();
    int exit_code = 0;
    for (int frame = 0; !glfwWindowShouldClose(window); ++frame) {
        const auto t0 = std::chrono::steady_clock::now();
        glfwPollEvents();
        ImGui_ImplOpenGL3_NewFrame();
        ImGui_ImplGlfw_NewFrame();
        if (screenshot) io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover highlight
        const auto t_ui = std::chrono::steady_clock::now();
        ImGui::NewFrame();
        gui::draw_inspector(model, ui);
        ImGui::Render();
        if (opts.report_frame_times) ui_ms.push_back(ms_since(t_ui));
        int fb_width = 0, fb_height = 0;
        glfwGetFramebufferSize(window, &fb_width, &fb_height);
        glViewport(0, 0, fb_width, fb_height);
        glClearColor(0.09f, 0.09f, 0.11f, 1.0f);
        glClear(GL_COLOR_BUFFER_BIT);
        ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
        const bool last = opts.frames > 0 && frame + 1 >= opts.frames;
        if (last && screenshot) {
            if (!write_png(opts.screenshot, fb_width, fb_height)) {
                std::fprintf(stderr, "kcache-inspector: cannot write %s\n",
                             opts.screenshot.c_str());
                exit_code = kExitError;
            }
        }
        glfwSwapBuffers(window);
        if (opts.report_frame_times) {
            glFinish();  // count the rendering, which llvmpipe does on the CPU
            frame_ms.push_back(ms_since(t0));
        }
        if (last) break;
    }
    return exit_code;
}

int run(const Options& opts) {
    int width = 1600, height = 1000;
    if (std::sscanf(opts.size.c_str(), "%dx%d", &width, &height) != 2 || width < 200 ||
        height < 150) {
        std::fprintf(stderr, "kcache-inspector: --size wants WIDTHxHEIGHT, e.g. 1600x1000\n");
        return kExitUsage;
    }

    gui::Model::Options model_options;
    model_options.db_path = opts.db.empty() ? core::default_db_path() : opts.db;
    auto model = gui::Model::open(model_options);
    if (!model) {
        std::fprintf(stderr, "kcache-inspector: %s\n", model.error().message.c_str());
        return kExitError;
    }
    if (opts.report_frame_times) {
        const std::size_t n = (*model)->entry_count();
        fmt::print(
            "model: {} entries loaded in {:.3f} s, {} bytes held ({:.1f} bytes/entry)\n", n,
            (*model)->last_load_seconds(), (*model)->memory_bytes(),
            n ? static_cast<double>((*model)->memory_bytes()) / static_cast<double>(n) : 0.0);
    }

    GLFWwindow* window = open_window(width, height, (*model)->db_path());
    if (!window) return kExitError;
    glfwMakeContextCurrent(window);
    // Benchmarks measure the frame, not the display's refresh.
    glfwSwapInterval(opts.frames > 0 ? 0 : 1);

    IMGUI_CHECKVERSION();
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    const bool screenshot = !opts.screenshot.empty();
    const std::string ini = screenshot ? std::string() : layout_path();
    io.IniFilename = ini.empty() ? nullptr : ini.c_str();
    ImGui::StyleColorsDark();
    ImGui::GetStyle().FrameRounding = 3;
    ImGui_ImplGlfw_InitForOpenGL(window, true);
    ImGui_ImplOpenGL3_Init("#version 130");

    gui::UiState ui;
    if (opts.scan_duplicates) {
        if (auto started = (*model)->start_duplicate_scan(); !started) {
            std::fprintf(stderr, "kcache-inspector: %s\n", started.error().message.c_str());
        }
    }
    if (opts.misses) {
        ui.show_misses = ui.focus_misses = ui.pick_compared_miss = true;
    }
    if (!opts.select.empty() && !gui::show_entry(**model, ui, opts.select, opts.file)) {
        std::fprintf(stderr, "kcache-inspector: note: no entry %s%s%s\n", opts.select.c_str(),
                     opts.file.empty() ? "" : " with file ", opts.file.c_str());
    }

    std::vector<double> frame_ms;
    std::vector<double> ui_ms;  // building the frame (model and panels), without rendering
    const int exit_code = run_frames(window, **model, ui, opts, screenshot, frame_ms, ui_ms);

    if (opts.report_frame_times && frame_ms.size() > 2) {
        report_frame_times("frame (all)", frame_ms);
        report_frame_times("frame (model + panels, no GL)", ui_ms);
        fmt::print("GL: {}\n", reinterpret_cast<const char*>(glGetString(GL_RENDERER)));
    }

    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();  // writes the layout
    glfwDestroyWindow(window);
    glfwTerminate();
    return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
    Options opts;
    CLI::App app{"kcache-inspector: browse, evict and pin the entries of a kcache db",
                 "kcache-inspector"};
    app.set_version_flag("--version", KCACHE_VERSION);
    app.add_option("--db", opts.db,
                   "cache db directory (default: $KCACHE_DB, else ~/.cache/kcache/db)")
        ->type_name("DIR");
    app.add_option("--screenshot", opts.screenshot,
                   "render --frames frames, write the last to FILE (PNG) and exit")
        ->type_name("FILE");
    app.add_option("--frames", opts.frames, "exit after N frames (--screenshot: default 4)")
        ->type_name("N")
        ->check(CLI::PositiveNumber);
    app.add_flag("--report-frame-times", opts.report_frame_times,
                 "print model load time, memory and frame times (mean, p95, max) on exit");
    app.add_option("--size", opts.size, "window size")->type_name("WxH")->capture_default_str();
    app.add_option("--select", opts.select, "show the entry whose key starts with KEY")
        ->type_name("KEY");
    app.add_option("--file", opts.file, "with --select: open this file of the entry")
        ->type_name("PATH");
    app.add_flag("--scan-duplicates", opts.scan_duplicates, "start the duplicates scan at once");
    app.add_flag("--misses", opts.misses,
                 "show the Misses window in front, the newest compared miss selected");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : kExitUsage;
    }
    if (!opts.screenshot.empty() && opts.frames == 0) opts.frames = 4;
    return run(opts);
}
