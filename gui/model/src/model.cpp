#include "kcache/gui/model.hpp"

#include <algorithm>

#include "kcache/gui/text.hpp"

namespace kcache::gui {

Result<std::unique_ptr<Model>> Model::open(const Options& options) {
    auto worker = KCACHE_TRY(Worker::start(options));
    std::unique_ptr<Model> model(new Model());
    model->m_worker = std::move(worker);
    model->m_clock = options.clock;
    model->adopt(model->m_worker->published());
    return model;
}

std::int64_t Model::now_ns() const {
    return m_clock ? m_clock() : core::system_clock_ns();
}

Result<bool> Model::refresh(bool force) {
    bool worker_changed = false;
    if (force) {
        auto looked = m_worker->look_now().get();
        if (!looked) {
            adopt(m_worker->published());
            m_error_serial = m_worker->published().error_serial;
            return tl::unexpected(looked.error());
        }
        worker_changed = *looked;
    }
    if (m_worker->serial() == m_serial) return worker_changed;
    Worker::Published published = m_worker->published();
    const bool new_error = published.error_serial != m_error_serial;
    const std::string error = published.error;
    m_error_serial = published.error_serial;
    const bool changed = adopt(std::move(published));
    if (new_error) return core::fail(EIO, error);
    return worker_changed || changed;
}

void Model::wait_idle() {
    m_worker->wait_idle();
    (void)refresh(false);
}

bool Model::adopt(Worker::Published published) {
    m_serial = published.serial;
    m_duplicates = std::move(published.duplicates);
    if (published.view == m_view) return false;
    std::shared_ptr<const View> old = std::move(m_view);
    m_view = std::move(published.view);
    const Catalog& now = catalog();
    if (!old || old->catalog != m_view->catalog) {
        // A new catalog: carry the selection over by ino (both are in ino order).
        std::vector<std::uint8_t> selected(now.rows.size(), 0);
        std::size_t count = 0;
        if (old && m_selected > 0) {
            const auto& before = old->catalog->rows;
            std::size_t j = 0;
            for (std::size_t i = 0; i < before.size(); ++i) {
                if (!m_selected_rows[i]) continue;
                while (j < now.rows.size() && now.rows[j].ino < before[i].ino) ++j;
                if (j < now.rows.size() && now.rows[j].ino == before[i].ino &&
                    !now.rows[j].gone()) {
                    selected[j] = 1;
                    ++count;
                }
            }
        }
        m_selected_rows = std::move(selected);
        m_selected = count;
        if (m_focused && !row(*m_focused)) m_focused.reset();
    }
    return true;
}

void Model::set_sort(SortSpec spec) {
    if (spec == m_spec.sort) return;
    m_spec.sort = spec;
    m_worker->set_view(m_spec);
}

void Model::set_filter(std::string_view text) {
    std::string lower = to_lower(text);
    if (lower == m_spec.filter) return;
    m_spec.filter = std::move(lower);
    m_worker->set_view(m_spec);
}

std::optional<std::size_t> Model::visible_index(core::Ino ino) const {
    const auto& order = m_view->order;
    for (std::size_t i = 0; i < order.size(); ++i) {
        if (catalog().rows[order[i]].ino == ino) return i;
    }
    return std::nullopt;
}

const EntryRow* Model::row(core::Ino ino) const {
    const EntryRow* r = catalog().find(ino);
    return r && !r->gone() ? r : nullptr;
}

void Model::select_only(std::size_t visible_index) {
    clear_selection();
    toggle_selected(visible_index);
}

void Model::toggle_selected(std::size_t visible_index) {
    const std::uint32_t index = m_view->order[visible_index];
    std::uint8_t& flag = m_selected_rows[index];
    flag ^= 1;
    if (flag) {
        ++m_selected;
        m_focused = catalog().rows[index].ino;
    } else {
        --m_selected;
    }
}

void Model::select_range(std::size_t a, std::size_t b) {
    if (m_view->order.empty()) return;
    if (a > b) std::swap(a, b);
    b = std::min(b, m_view->order.size() - 1);
    for (std::size_t i = a; i <= b; ++i) {
        std::uint8_t& flag = m_selected_rows[m_view->order[i]];
        if (!flag) {
            flag = 1;
            ++m_selected;
        }
    }
}

void Model::select_all_visible() {
    if (!m_view->order.empty()) select_range(0, m_view->order.size() - 1);
}

void Model::clear_selection() {
    if (m_selected == 0) return;
    std::fill(m_selected_rows.begin(), m_selected_rows.end(), 0);
    m_selected = 0;
}

std::uint64_t Model::selected_bytes() const {
    std::uint64_t bytes = 0;
    if (m_selected == 0) return 0;
    const auto& rows = catalog().rows;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        if (m_selected_rows[i]) bytes += rows[i].bytes;
    }
    return bytes;
}

std::vector<core::Ino> Model::selected_inos() const {
    std::vector<core::Ino> inos;
    if (m_selected == 0) return inos;
    inos.reserve(m_selected);
    const auto& rows = catalog().rows;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        if (m_selected_rows[i] && !rows[i].gone()) inos.push_back(rows[i].ino);
    }
    return inos;
}

std::future<Result<ActionReport>> Model::request(Action action, std::int64_t age_ns) {
    ActionRequest request;
    request.action = action;
    request.age_ns = age_ns;
    if (action == Action::evict || action == Action::pin || action == Action::unpin) {
        request.inos = selected_inos();
    }
    return m_worker->act(std::move(request));
}

Result<ActionReport> Model::finish(std::future<Result<ActionReport>> future) {
    auto report = future.get();
    (void)refresh(false);
    return report;
}

Result<ActionReport> Model::evict_selected() {
    return finish(request(Action::evict));
}

Result<ActionReport> Model::evict_older_than(std::int64_t age_ns) {
    return finish(request(Action::evict_older, age_ns));
}

Result<ActionReport> Model::set_selected_pinned(bool pinned) {
    return finish(request(pinned ? Action::pin : Action::unpin));
}

Result<ActionReport> Model::clear() {
    return finish(request(Action::clear));
}

Status Model::start_duplicate_scan() {
    m_worker->scan_duplicates();
    // Shown as started at once; the worker's report follows.
    m_duplicates.started_ = true;
    m_duplicates.running_ = true;
    m_duplicates.scanned_ = 0;
    m_duplicates.total_ = entry_count();
    return {};
}

std::size_t Model::memory_bytes() const {
    return catalog().memory_bytes() + m_view->order.capacity() * sizeof(std::uint32_t) +
           m_selected_rows.capacity();
}

}  // namespace kcache::gui
