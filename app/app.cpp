#include "app/app.h"

#include <GL/gl.h>
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_opengl3.h>
#include <time.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "app/compare_view.h"
#include "app/display.h"
#include "app/layout_check.h"
#include "app/lesson_host.h"
#include "app/screenshots.h"
#include "app/script_runner.h"
#include "app/session.h"
#include "app/spoilers.h"
#include "app/trace_viewer.h"
#include "app/views/data_view.h"
#include "app/views/lesson_view.h"
#include "app/views/memory_view.h"
#include "app/views/timeline_view.h"
#include "app/views/views.h"
#include "engine/core/check.h"
#include "engine/train/compose.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

using Clock = std::chrono::steady_clock;

enum ViewId { kRing, kBuckets, kTimeline, kMemory, kInspector, kData, kShards, kPipeline, kTopology, kSweep, kMesh, kSizing, kRoofline, kExperts, kAllToAll, kContext, kNumViews };
// With --open the lab shows imported traces in its own four panels instead (app/views/trace_view.cpp).
enum TraceViewId { kTraceTimeline, kTraceCollectives, kTraceBreakdown, kTraceCompare, kNumTraceViews };
const char* kTraceViewTitles[kNumTraceViews] = {"Timeline", "Collectives", "Breakdown", "Compare"};
const char* kTraceViewNames[kNumTraceViews] = {"timeline", "collectives", "breakdown", "compare"};
const char* kViewTitles[kNumViews] = {"Ring", "Buckets", "Timeline", "Memory", "Collective", "Data", "Shards", "Pipeline", "Topology", "Bus bandwidth", "Mesh", "Sizing", "Roofline", "Experts", "All-to-all", "Context"};
const char* kViewNames[kNumViews] = {"ring", "buckets", "timeline", "memory", "inspector", "data", "shards", "pipeline", "topology", "sweep", "mesh", "sizing", "roofline", "experts", "alltoall", "context"};

// The pipeline controls (Run panel, pipeline view) in and out of a run configuration.
PipelineRequest pipeline_request_of(const TrainConfig& c) {
  return {c.pipeline.schedule, c.pipeline.stages, c.pipeline.microbatches, c.pipeline.chunks, c.pipeline.fixed_costs.has_value()};
}
void apply_pipeline_request(TrainConfig& c, const PipelineRequest& r) {
  c.strategy = Strategy::Pipeline;
  c.pipeline.schedule = r.kind;
  c.pipeline.stages = r.stages, c.pipeline.microbatches = r.microbatches, c.pipeline.chunks = r.chunks;
  if (r.unit_costs) c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
  else c.pipeline.fixed_costs.reset();
  fit_pipeline(c);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string config_dir(const AppOptions& o) {
  if (!o.config_dir.empty()) return o.config_dir;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/dtlab";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.config/dtlab";
  return {};
}

const char* first_existing(std::initializer_list<const char*> paths) {
  for (const char* p : paths)
    if (std::filesystem::exists(p)) return p;
  return nullptr;
}

// The window and its frame loop; the dispatcher that lays out and draws the views. What a script,
// a lesson, the trace viewer and the screen checks keep is theirs (one file each); the app hands
// them the frame.
class App : public ScriptRunner::Host {
 public:
  explicit App(AppOptions& o) : opt_(o), lessons_(o.play, !o.script.empty() || o.play ? "" : progress_path(), o.lesson_seed) {}
  int run();

 private:
  bool init_window();
  void init_imgui();
  void apply_style();
  float content_scale() const;  // the display's, from GLFW
  void build_fonts();
  void follow_content_scale();
  // present: draw the frame's pixels and swap; a scripted run skips it between its paced frames.
  void frame(bool present = true);
  void handle_keys();
  void toolbar();
  void view_combo(const char* const* titles, int n);
  void config_panel();
  void views();
  // --open, or a lesson's `open:`: the imported traces' panels
  void trace_toolbar();
  void cover_view();
  void trace_views();
  void lesson_panel(ImVec2 pos, ImVec2 size);
  // What scripts ask of the window (ScriptRunner::Host).
  void restart(const TrainConfig& c) override;
  void show_view(const std::string& name) override;
  void set_sizing(const std::string& spec) override;
  void set_context_block(int block, bool backward) override;
  void set_presentation(bool on) override;
  void set_fullscreen(bool on) override { fullscreen_.set(win_, on), relayout_ = true; }
  void start_screen(const std::string& what) override;
  void start_choice(StartChoice choice, bool step_iterations);
  std::string start_off_path() const;  // its file says "do not show the start screen at start"
  void set_modeled_clock(bool on) override { ctx_.modeled_clock = on; }
  void set_peak_colours(bool on) override { timeline_view_.by_peak = on; }
  void set_data_set_epoch(bool on) override;
  std::string generate_text(const std::string& prompt) override;
  void refresh_attention();
  void lesson_opened() override { show_lessons_ = relayout_ = true; }
  void lesson_ran() override;
  std::string pin_run() override;
  void unpin_run() override { compare_.unpin(), relayout_ = true; }
  std::string compare_run(const std::vector<std::string>& flags) override;
  bool compared(int view) const;  // the view's window draws A above B

  AppOptions& opt_;
  std::unique_ptr<Session> session_;  // null for the trace viewer alone (--open)
  TraceViewer traces_;                // --open, or a lesson's `open:`
  LessonHost lessons_;
  Screenshots shots_;
  SpoilerCheck spoilers_;             // --check-spoilers
  AppOutcome outcome_;
  // scripted runs: the script's commands, then (or, interactively, only) what lessons queue
  std::unique_ptr<ScriptRunner> script_;
  GLFWwindow* win_ = nullptr;
  std::unique_ptr<GlResources> gl_;
  ViewContext ctx_;
  // what the views keep between frames (app/views/*_view.h)
  TimelineViewState timeline_view_;
  MemoryViewState memory_view_;
  DataViewState data_view_;
  LessonViewState lesson_view_;
  std::string ini_path_;
  ImFont* font_normal_ = nullptr;
  ImFont* font_large_ = nullptr;
  float scale_ = 1;             // fonts and spacing (app/display.h ui_scale)
  float large_px_ = 28;         // presentation's font, before scale_: presentation_font_px of the window's height
  FullScreen fullscreen_;       // F11, --fullscreen
  bool presentation_ = false;
  std::string last_hint_;       // the toolbar's "Next: ..." line of the last settled pause
  int solo_ = -1;             // a view filling the work area, or -1 for the tiled layout
  bool relayout_ = false;     // place the windows at their tiled positions this frame
  float toolbar_h_ = 0;       // the toolbar's height last frame
  std::string config_error_;
  TrainConfig edit_;          // the configuration panel's working copy
  bool was_pipeline_ = false;  // the tiles differ for pipelines: lay them out again on a switch
  bool was_stage_ = false;     // presentation's four tiles were laid out last frame
  bool was_compare_ = false;   // the A/B comparison's tiles were laid out last frame
  RingViewState ring_view_;    // what the ring and pipeline views keep between frames
  PipelineViewState pipeline_view_;
  SizingViewState sizing_view_;  // the calculator's settings (view sizing)
  ExpertsViewState experts_view_;  // whose tokens the Experts view shows without a focus
  AllToAllViewState alltoall_view_;  // the group the All-to-all view shows when the stepper holds none of its
  ContextViewState context_view_;    // the Context view's block: the running pass, or one chosen
  CompareState compare_;       // A/B: the pinned run and A's view states (app/compare_view.h)
  double start_time_ = 0;
  bool show_lessons_ = false;  // the lesson panel on the left
  bool show_start_ = false;    // the start screen (app/views/start_view.cpp)
  bool start_at_launch_ = true;  // its checkbox, kept as start_off_path()'s absence
};

bool App::init_window() {
  const char* display = std::getenv("DISPLAY");
  const char* wayland = std::getenv("WAYLAND_DISPLAY");
  if ((!display || !*display) && (!wayland || !*wayland)) {
    std::fprintf(stderr,
                 "dtlab: no display (DISPLAY is not set); run the lab under a virtual display with "
                 "`xvfb-run -a build/bin/dtlab`, or use the command line: `build/bin/dtlab-cli train --strategy ddp --world 4`\n");
    return false;
  }
  if (!glfwInit()) {  // its own error ("X11: Failed to open display :0") is this sentence: not printed twice
    std::fprintf(stderr, "dtlab: cannot open the display '%s'; check DISPLAY, or run `xvfb-run -a build/bin/dtlab`\n",
                 display ? display : "");
    return false;
  }
  glfwSetErrorCallback([](int code, const char* what) { std::fprintf(stderr, "dtlab: GLFW error %d: %s\n", code, what); });
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  // Sized to the monitor new windows open on (a 1920x1080 projector gets a large window, a 1366x768
  // laptop one that fits), unless --width/--height say; shown once placed.
  ScreenRect area{0, 0, 1600 * 10 / 9, 900 * 10 / 9};  // no monitor reported: 1600x900
  if (GLFWmonitor* primary = glfwGetPrimaryMonitor()) {
    ScreenRect a;
    glfwGetMonitorWorkarea(primary, &a.x, &a.y, &a.w, &a.h);
    if (a.w > 0 && a.h > 0) area = a;
  }
  const ScreenRect place = fit_window(area, opt_.width, opt_.height);
  glfwWindowHint(GLFW_VISIBLE, GLFW_FALSE);
  // Full screen on a projector stays up while the presenter clicks on the laptop's own screen.
  glfwWindowHint(GLFW_AUTO_ICONIFY, GLFW_FALSE);
  win_ = glfwCreateWindow(place.w, place.h, "dtlab — distributed training lab", nullptr, nullptr);
  if (!win_) {
    std::fprintf(stderr, "dtlab: this display offers no OpenGL 3.3 core context; update the graphics driver or run under `xvfb-run -a` (Mesa)\n");
    glfwTerminate();
    return false;
  }
  glfwSetWindowPos(win_, place.x, place.y);
  glfwShowWindow(win_);
  if (opt_.fullscreen) fullscreen_.set(win_, true);
  glfwGetWindowSize(win_, &opt_.width, &opt_.height);
  glfwMakeContextCurrent(win_);
  keep_libraries_loaded();  // sanitizer builds: the GL driver stays loaded for LeakSanitizer's check at exit
  // Scripts, screenshots and the frame benchmark run as fast as they can; people get vsync.
  glfwSwapInterval(opt_.script.empty() && opt_.screenshot.empty() && opt_.bench_frames == 0 && !opt_.play ? 1 : 0);
  return true;
}

void App::init_imgui() {
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  // The layout lives in the user's config directory, never the working directory.
  std::string dir = config_dir(opt_);
  io.IniFilename = nullptr;
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (!ec) {
      ini_path_ = dir + "/imgui.ini";
      io.IniFilename = ini_path_.c_str();
    }
  }
  // Scripted runs (tests, the screenshots in README and docs/) always start from the tiled layout.
  if (!opt_.script.empty() || !opt_.screenshot.empty() || opt_.bench_frames || opt_.play) io.IniFilename = nullptr;
  scale_ = ui_scale(content_scale(), opt_.scale);
  {
    int w = 0, h = 0;
    glfwGetWindowSize(win_, &w, &h);
    large_px_ = presentation_font_px(static_cast<float>(h) / scale_);
  }
  build_fonts();
  ImGui_ImplGlfw_InitForOpenGL(win_, true);
  ImGui_ImplOpenGL3_Init("#version 330 core");
  presentation_ = opt_.presentation;
  apply_style();
}

float App::content_scale() const {
  float xs = 1, ys = 1;
  glfwGetWindowContentScale(win_, &xs, &ys);
  return std::max(xs, ys);
}

// The two fonts at the UI's scale: 16 and 28 pixels at scale 1 (normal and presentation), rasterized
// at their final size so scaled text stays sharp.
void App::build_fonts() {
  ImGuiIO& io = ImGui::GetIO();
  io.Fonts->Clear();
  font_normal_ = font_large_ = nullptr;
  const char* sans = first_existing({"/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                                     "/usr/share/fonts/TTF/DejaVuSans.ttf"});
  // Latin-1 plus what the views print: Greek (Σ, µ), punctuation (—, …), arrows, math, boxes, ✓.
  static const ImWchar ranges[] = {0x0020, 0x00FF, 0x0370, 0x03FF, 0x2000, 0x206F, 0x2190, 0x21FF, 0x2200,
                                   0x22FF, 0x2500, 0x25FF, 0x2700, 0x27BF, 0};
  if (sans) {
    font_normal_ = io.Fonts->AddFontFromFileTTF(sans, std::round(16.0f * scale_), nullptr, ranges);
    font_large_ = io.Fonts->AddFontFromFileTTF(sans, std::round(large_px_ * scale_), nullptr, ranges);
  }
  if (!font_normal_) {
    static bool said = false;
    if (!said) std::fprintf(stderr, "dtlab: DejaVu Sans not found (apt-get install fonts-dejavu-core); using ImGui's built-in font\n");
    said = true;
    ImFontConfig normal;
    normal.SizePixels = std::round(13.0f * scale_);
    font_normal_ = io.Fonts->AddFontDefault(&normal);
    ImFontConfig big;
    big.SizePixels = std::round(26.0f * scale_);
    font_large_ = io.Fonts->AddFontDefault(&big);
  }
}

// The window moved to a display of another content scale (a laptop's HiDPI panel to a projector):
// fonts and spacing follow, before the frame starts. --scale pins them. Presentation's type follows
// the window's height too (app/display.h presentation_font_px).
void App::follow_content_scale() {
  const float s = opt_.scale > 0 ? scale_ : ui_scale(content_scale(), 0);
  int w = 0, h = 0;
  glfwGetWindowSize(win_, &w, &h);
  const float large = presentation_font_px(static_cast<float>(h) / s);
  if (s == scale_ && large == large_px_) return;
  scale_ = s;
  large_px_ = large;
  build_fonts();
  ImGui_ImplOpenGL3_DestroyFontsTexture();
  ImGui_ImplOpenGL3_CreateFontsTexture();
  apply_style();
  relayout_ = true;
}

void App::apply_style() {
  ImGuiStyle& st = ImGui::GetStyle();
  st = ImGuiStyle();
  ImGui::StyleColorsDark(&st);
  st.WindowRounding = 4;
  st.FrameRounding = 3;
  st.WindowPadding = ImVec2(8, 6);
  if (presentation_) {
    // High contrast for projectors: black background, white text, bright frames.
    st.Colors[ImGuiCol_WindowBg] = ImVec4(0, 0, 0, 1);
    st.Colors[ImGuiCol_ChildBg] = ImVec4(0, 0, 0, 1);
    st.Colors[ImGuiCol_Text] = ImVec4(1, 1, 1, 1);
    st.Colors[ImGuiCol_Border] = ImVec4(0.8f, 0.8f, 0.8f, 1);
    st.Colors[ImGuiCol_TitleBgActive] = ImVec4(0.1f, 0.3f, 0.7f, 1);
    st.Colors[ImGuiCol_FrameBg] = ImVec4(0.2f, 0.2f, 0.25f, 1);
    st.WindowBorderSize = 2;
    st.FrameBorderSize = 1;
  }
  st.ScaleAllSizes(scale_);
  ImGui::GetIO().FontDefault = presentation_ ? font_large_ : font_normal_;
  ctx_.presentation = presentation_;
}

void App::restart(const TrainConfig& c) {
  try {
    session_->restart(c);
    config_error_.clear();
  } catch (const Error& e) {
    config_error_ = e.what();
  }
}

std::string App::pin_run() {
  if (!session_) return "pin needs a run in this window (not only imported traces)";
  compare_.pin(session_->snapshot());
  relayout_ = true;
  return "";
}

std::string App::compare_run(const std::vector<std::string>& flags) {
  if (!session_ || session_->attached()) return "compare starts run B in this window; an attached run's settings are the launch command's";
  TrainConfig c = session_->config();
  try {
    apply_compare_flags(c, flags);
  } catch (const Error& e) {
    return e.what();
  }
  if (!compare_.active()) pin_run();
  c.start_paused = session_->paused();
  restart(c);
  edit_ = session_->config();
  return config_error_;
}

bool App::compared(int view) const {
  return compare_.active() && (view == kTimeline || view == kMemory || view == kBuckets || view == kShards || view == kPipeline);
}

void App::handle_keys() {
  ImGuiIO& io = ImGui::GetIO();
  if (io.WantTextInput) return;
  // ImGui 1.86's GLFW backend indexes keys by GLFW key code.
  auto key = [&](int glfw_key) { return ImGui::IsKeyPressed(glfw_key, false); };
  auto solo_keys = [&](int views) {
    for (int v = 0; v < std::min(views, 9); v++)  // keys 1..9; later views have no key
      if (key(GLFW_KEY_1 + v)) solo_ = solo_ == v ? -1 : v, relayout_ = true;
    if (key(GLFW_KEY_0)) solo_ = -1, relayout_ = true;
  };
  if (key(GLFW_KEY_P)) {
    presentation_ = !presentation_;
    apply_style();
    relayout_ = true;
  }
  if (key(GLFW_KEY_F11)) {
    fullscreen_.toggle(win_);
    relayout_ = true;
  }
  if (key(GLFW_KEY_H) && !traces_.active() && session_ && !session_->attached()) show_start_ = !show_start_;
  if (traces_.active()) {  // the trace viewer has no run to step; a lesson reading a trace keeps L and N
    if (key(GLFW_KEY_L) && lessons_.runner()) show_lessons_ = !show_lessons_, relayout_ = true;
    if (key(GLFW_KEY_N) && lessons_.runner()) script_->queue_lesson("demo");
    solo_keys(kNumTraceViews);
    return;
  }
  if (key(GLFW_KEY_SPACE)) {
    if (session_->paused()) session_->run(session_->speed());
    else session_->pause();
  }
  if (key(GLFW_KEY_R)) session_->step(GateKind::RingStep);
  if (key(GLFW_KEY_C)) session_->step(GateKind::Collective);
  if (key(GLFW_KEY_I)) session_->step(GateKind::Iteration);
  if (key(GLFW_KEY_A)) session_->step(GateKind::Action);
  if (key(GLFW_KEY_F)) session_->step(GateKind::Layer);
  if (key(GLFW_KEY_B)) session_->step(GateKind::Grad);
  if (key(GLFW_KEY_BACKSPACE)) restart(session_->config());
  if (key(GLFW_KEY_M)) ctx_.modeled_clock = !ctx_.modeled_clock;
  if (key(GLFW_KEY_L)) show_lessons_ = !show_lessons_, relayout_ = true;
  // The presenter's one key: the lesson's next action or reveal.
  if (key(GLFW_KEY_N) && lessons_.runner()) script_->queue_lesson("demo");
  solo_keys(kNumViews);
}

// The toolbar's "all views / one view" picker (keys 0 and 1..n).
void App::view_combo(const char* const* titles, int n) {
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 7);
  if (ImGui::BeginCombo("##view", solo_ < 0 ? "all views" : titles[solo_])) {
    if (ImGui::Selectable("all views (0)", solo_ < 0)) solo_ = -1, relayout_ = true;
    for (int v = 0; v < n; v++) {
      std::string item = std::string(titles[v]) + (v < 9 ? " (" + std::to_string(v + 1) + ")" : "");
      if (ImGui::Selectable(item.c_str(), solo_ == v)) solo_ = v, relayout_ = true;
    }
    ImGui::EndCombo();
  }
}

// The toolbar window across the top; its height, once known, places the tiles below it.
void begin_toolbar() {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(ImVec2(vp->WorkSize.x, 0));
  ImGui::Begin("##toolbar", nullptr,
               ImGuiWindowFlags_NoTitleBar | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoMove |
                   ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_AlwaysAutoResize | ImGuiWindowFlags_NoScrollbar);
}
// `text` within `width` pixels: its last "; " clauses dropped while it is too wide, then cut with "...".
std::string fit_clauses(std::string text, float width) {
  while (ImGui::CalcTextSize(text.c_str()).x > width) {
    const size_t cut = text.rfind("; ");
    if (cut == std::string::npos) break;
    text.resize(cut);
  }
  return fit_text(text, width);  // one clause still too long: cut with "..."
}

void end_toolbar(float& toolbar_h, bool& relayout) {
  const float h = ImGui::GetWindowHeight();
  if (h != toolbar_h) relayout = toolbar_h > 0 || relayout, toolbar_h = h;  // the tiles sit below it
  ImGui::End();
}

void App::toolbar() {
  begin_toolbar();
  const Snapshot& s = session_->snapshot();
  const bool paused = session_->paused();
  // Each control after the first goes on the same line while it fits, else starts the next one
  // (presentation's large font at 1600x900 cut "Modeled clock (M)" off at the edge).
  const ImGuiStyle& st = ImGui::GetStyle();
  auto button_w = [&](const char* l) { return ImGui::CalcTextSize(l).x + st.FramePadding.x * 2; };
  auto check_w = [&](const char* l) { return ImGui::GetFrameHeight() + st.ItemInnerSpacing.x + ImGui::CalcTextSize(l).x; };
  auto next = [](float w) { flow(w); };
  if (ImGui::Button(paused ? "Run (Space)" : "Pause (Space)")) {
    if (paused) session_->run(session_->speed());
    else session_->pause();
  }
  next(button_w("Ring step (R)"));
  if (ImGui::Button("Ring step (R)")) session_->step(GateKind::RingStep);
  next(button_w("Collective (C)"));
  if (ImGui::Button("Collective (C)")) session_->step(GateKind::Collective);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("The next communication operation: a collective of the world or of any process group, or a send/recv");
  next(button_w("Layer (F)"));
  if (ImGui::Button("Layer (F)")) session_->step(GateKind::Layer);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("The next layer's forward or backward (every rank, or the focused rank alone)");
  next(button_w("Bucket (B)"));
  if (ImGui::Button("Bucket (B)")) session_->step(GateKind::Grad);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Until the next gradient lands in a DDP bucket");
  next(button_w("Iteration (I)"));
  if (ImGui::Button("Iteration (I)")) session_->step(GateKind::Iteration);
  if (s.pipeline.valid) {
    next(button_w("Action (A)"));
    if (ImGui::Button("Action (A)")) session_->step(GateKind::Action);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("One time step of the pipeline schedule: every rank's next action");
  }
  next(button_w("Reset (Bksp)"));
  ImGui::BeginDisabled(session_->attached());
  if (ImGui::Button("Reset (Bksp)")) restart(session_->config());
  ImGui::EndDisabled();
  // A/B: pin this run, change a setting, and the views draw both.
  const char* pin_label = compare_.active() ? "Unpin A" : "Pin as A";
  next(button_w(pin_label));
  if (ImGui::Button(pin_label)) compare_.active() ? unpin_run() : (void)pin_run();
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(compare_.active() ? "End the A/B comparison"
                                        : "Keep this run as A, then change a setting in the Run panel and apply it:\n"
                                          "the timeline, memory, buckets and pipeline show A above B, with a table of what differs");
  next(ImGui::GetFontSize() * 9);
  // Speed: modeled seconds per wall second, on a log slider (0 = as fast as possible).
  float speed = static_cast<float>(session_->speed());
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9);
  if (ImGui::SliderFloat("##speed", &speed, 0.0f, 1.0f, speed == 0 ? "speed: full" : "%.2e model s/s",
                         ImGuiSliderFlags_Logarithmic)) {
    if (paused) session_->pause();
    session_->run(speed);
    if (paused) session_->pause();
  }
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Modeled seconds per wall second while running (0: full speed)");
  next(check_w("Modeled clock (M)"));
  ImGui::Checkbox("Modeled clock (M)", &ctx_.modeled_clock);
  next(check_w("Presentation (P)"));
  if (ImGui::Checkbox("Presentation (P)", &presentation_)) {
    apply_style();
    relayout_ = true;
  }
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Large fonts and high contrast, for a projector; F11: full screen");
  next(check_w("Lessons (L)"));
  if (ImGui::Checkbox("Lessons (L)", &show_lessons_)) relayout_ = true;
  next(ImGui::GetFontSize() * 7 + ImGui::GetFrameHeight());
  view_combo(kViewTitles, kNumViews);
  // Status: where the run stands (on a second line when large fonts leave no room).
  std::string status;
  if (!s.error.empty()) status = "FAILED (see Collective)";
  else if (s.finished) status = "finished";
  else if (paused) {
    status = "paused";
    // The item the next step releases (engine/trace/stepper.h), else what the stepper waits for.
    const PendingItem& p = s.stepper.pending;
    if (p.valid) status += " before " + pending_text(p);
    else if (!s.stepper.waiting.empty()) status += ": " + s.stepper.waiting;
  } else status = "running";
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  iteration %d  %s  [%s/%s%s%s]", static_cast<long long>(s.step),
                static_cast<long long>(s.total_steps), s.iteration, status.c_str(), s.config.device.c_str(),
                s.config.backend.c_str(), s.config.attached.empty() ? "" : " @", s.config.attached.c_str());
  flow(ImGui::CalcTextSize(line).x);
  // Wider than a whole line (8 ranks' list under presentation's font): cut, whole on hover.
  const std::string shown = fit_clauses(line, ImGui::GetContentRegionAvail().x);
  ImGui::TextUnformatted(shown.c_str());
  if (shown != line && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", line);
  // What the next press does, and which key (a newcomer's first question). Always one line, so the
  // toolbar keeps its height (the tiles below it would move); between two settled pauses the last
  // hint stays.
  std::string hint = next_hint(s);
  if (!s.error.empty()) hint = "The run failed: the Collective panel says why. Backspace starts it again";
  else if (s.finished) hint = "Finished. Backspace starts the run again";
  else if (!paused) hint = "Running. Space pauses; then R, C, I, F and B step a ring step, a collective, an iteration, a layer, a gradient";
  else if (hint.empty()) hint = last_hint_;
  last_hint_ = hint;
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.85f, 0.45f, 1.0f));
  ImGui::TextUnformatted(fit_clauses(hint, ImGui::GetContentRegionAvail().x).c_str());
  ImGui::PopStyleColor();
  end_toolbar(toolbar_h_, relayout_);
}

// Where the ranks run, in words, for the Run panel.
std::string backend_words(const RunConfigView& rc) {
  const std::string n = std::to_string(rc.world) + (rc.world == 1 ? " rank" : " ranks");
  if (rc.backend == "socket") return n + " as processes (dtlab-cli launch), collectives over TCP";
  if (rc.backend == "cuda") return n + " sharing the GPU, collectives as device copies and reduction kernels";
  if (rc.backend == "nccl") return n + ", one GPU each, collectives by NCCL (stepped one collective at a time)";
  return n + " as threads of this process, each with its own memory";
}

// The Run panel's controls edit `c`; each returns true once an edit is complete (the run restarts).

// Greys out the controls made in its scope when `why` (the capability table's sentence, strategy.h)
// is not empty, and shows it when the control is hovered.
struct Refused {
  std::string why;
  explicit Refused(std::string w) : why(std::move(w)) { ImGui::BeginDisabled(!why.empty()); }
  ~Refused() {
    ImGui::EndDisabled();
    if (!why.empty() && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled)) ImGui::SetTooltip("%s", why.c_str());
  }
};

// The run with feature `f` turned on, for asking the table before the control is touched.
TrainConfig with_feature(TrainConfig c, Feature f) {
  if (f == Feature::TensorParallel && c.tp == 1) c.tp = 2;
  if (f == Feature::SequenceParallel) c.sequence_parallel = true;
  if (f == Feature::MixedPrecision && !is_mixed(c.precision)) c.precision = Precision::BF16;
  if (f == Feature::Lora && c.lora.rank == 0) c.lora.rank = 4;
  if (f == Feature::Recompute) c.activation_checkpointing = true;
  return c;
}

std::string refusal_of(const TrainConfig& c, Feature f) { return feature_refusal(with_feature(c, f), f); }

std::string off_or(int v, const char* prefix) { return v == 0 || (v == 1 && std::string(prefix) == "tp ") ? "off" : prefix + std::to_string(v); }

// Strategy, world, model, batch and accumulation.
bool strategy_controls(TrainConfig& c) {
  bool changed = false;
  // The strategy table's rows; one that refuses a feature this run turns on is greyed out, with why.
  if (ImGui::BeginCombo("strategy", strategy_name(c.strategy))) {
    for (const StrategyTraits& t : strategy_table()) {
      TrainConfig next = c;
      next.strategy = t.kind;
      if (t.kind == Strategy::Single) next.world_size = 1;
      std::string why;
      for (Feature f : features_used(next))
        if (why.empty()) why = feature_refusal(next, f);
      if (ImGui::Selectable(t.name, c.strategy == t.kind, why.empty() ? 0 : ImGuiSelectableFlags_Disabled) && c.strategy != t.kind) {
        c.strategy = t.kind;
        if (c.strategy == Strategy::Single) c.world_size = 1;
        else if (c.world_size < 2) c.world_size = 4;
        if (c.strategy == Strategy::Pipeline) apply_pipeline_request(c, pipeline_request_of(c));
        changed = true;
      }
      if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
        ImGui::SetTooltip("%s (%s)%s%s", t.summary, t.torch, why.empty() ? "" : "\n", why.c_str());
    }
    ImGui::EndCombo();
  }
  int world = c.world_size;
  ImGui::BeginDisabled(c.strategy == Strategy::Single || c.strategy == Strategy::Pipeline);  // a pipeline's world is p x dp
  ImGui::SliderInt("world", &world, 1, 16);
  if (ImGui::IsItemDeactivatedAfterEdit()) {
    c.world_size = world, changed = true;
    if (c.fsdp.sharding == Sharding::Hybrid && c.fsdp.node_size > 0 && world % c.fsdp.node_size != 0)
      c.fsdp.node_size = world % 2 == 0 ? world / 2 : 1;
  }
  ImGui::EndDisabled();
  const char* presets[] = {"mlp:2,16,16,3", "mlp:2,64,64,3", "mlp:2,64,64,64,64,3", "mlp:2,256,256,3"};
  const std::string cur = c.model.str();
  if (ImGui::BeginCombo("model", cur.c_str())) {
    for (const char* p : presets)
      if (ImGui::Selectable(p, cur == p)) c.model = ModelSpec::parse(p), changed = true;
    ImGui::EndCombo();
  }
  int batch = static_cast<int>(c.batch);
  if (ImGui::InputInt("batch/rank", &batch) && batch >= 1) c.batch = batch;
  if (ImGui::IsItemDeactivatedAfterEdit()) changed = true;
  int accum = static_cast<int>(c.accum);
  {
    Refused r(feature_refusal(c, Feature::Accumulation));
    if (ImGui::InputInt("accum", &accum) && accum >= 1) c.accum = accum;
    if (ImGui::IsItemDeactivatedAfterEdit()) changed = true;
  }
  return changed;
}

// DDP's buckets (shown disabled for single).
bool ddp_controls(TrainConfig& c) {
  bool changed = false;
  ImGui::BeginDisabled(c.strategy != Strategy::Ddp);
  float cap_kib = static_cast<float>(c.ddp.bucket_cap_bytes) / 1024.0f;
  float first_kib = static_cast<float>(c.ddp.first_bucket_bytes) / 1024.0f;
  if (ImGui::InputFloat("bucket KiB", &cap_kib, 1, 16, "%.1f") && cap_kib > 0)
    c.ddp.bucket_cap_bytes = static_cast<int64_t>(cap_kib * 1024);
  if (ImGui::IsItemDeactivatedAfterEdit()) changed = true;
  if (ImGui::InputFloat("first KiB", &first_kib, 1, 16, "%.1f") && first_kib > 0)
    c.ddp.first_bucket_bytes = static_cast<int64_t>(first_kib * 1024);
  if (ImGui::IsItemDeactivatedAfterEdit()) changed = true;
  if (ImGui::Checkbox("find_unused_parameters", &c.ddp.find_unused_parameters)) changed = true;
  // torch builds ONE bucket for iteration 1 (find_unused_parameters=False); this lab option shows
  // the sized buckets from the start instead, and says so.
  ImGui::BeginDisabled(c.ddp.find_unused_parameters);
  if (ImGui::Checkbox("sized first buckets (lab)", &c.ddp.sized_first_iteration)) changed = true;
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("Not torch's default: torch's DDP all-reduces every gradient as one bucket in the first\n"
                      "iteration, then rebuilds sized buckets in the order gradients arrived. On: sized buckets from\n"
                      "the first iteration.");
  // --comm-hook: torch's register_comm_hook (the Buckets view shows the bytes sent against the bytes held).
  // Each error-feedback hook also without it, to see what the remembered error buys.
  static const char* const hooks[] = {"none", "fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.01,error_feedback=false",
                                      "powersgd:rank=1,start=2", "powersgd:rank=1,start=2,error_feedback=false",
                                      "powersgd:rank=4,start=2"};
  const std::string cur = comm_hook_text(c.ddp.comm_hook);
  if (ImGui::BeginCombo("comm hook", cur.c_str())) {
    for (const char* h : hooks)
      if (ImGui::Selectable(h, cur == h)) c.ddp.comm_hook = parse_comm_hook(h), changed = true;
    ImGui::EndCombo();
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("DDP communication hook: fp16 / bf16 cast each bucket to 16 bits before its all-reduce (torch's\n"
                      "fp16_compress_hook, bf16_compress_hook); topk sends each rank's largest 1%% of entries with\n"
                      "their indices and keeps the rest as error feedback; powersgd sends each gradient matrix as\n"
                      "rank-R factors P (n x R) and Q (m x R), three all-reduces per bucket (torch's powerSGD_hook).\n"
                      "error_feedback=false: nothing that was not sent is remembered, and no error buffer is held.");
  ImGui::EndDisabled();
  return changed;
}

// FSDP's options (torch's names).
bool fsdp_controls(TrainConfig& c) {
  bool changed = false;
  const char* apis[] = {"FSDP1 (flat)", "FSDP2 fully_shard"};
  int api = c.fsdp.api == 2 ? 1 : 0;
  if (ImGui::Combo("API", &api, apis, 2)) {
    c.fsdp.api = api + 1, changed = true;
    if (c.fsdp.api == 2) {
      // fully_shard has no SHARD_GRAD_OP, NO_SHARD, ZeRO-1 or BACKWARD_POST: their nearest FSDP2 settings.
      if (c.fsdp.sharding == Sharding::ShardGradOp) c.fsdp.reshard_after_forward = 0;
      if (c.fsdp.sharding != Sharding::Hybrid) c.fsdp.sharding = Sharding::FullShard;
      if (c.fsdp.backward_prefetch == BackwardPrefetch::Post) c.fsdp.backward_prefetch = BackwardPrefetch::Pre;
    } else {
      c.fsdp.reshard_after_forward = kReshardTrue;
      c.fsdp.prefetch = 1;
    }
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("FSDP1: FullyShardedDataParallel, each unit one flat parameter cut in W chunks\n"
                      "FSDP2: fully_shard, each parameter cut on dim 0 on its own (a DTensor, Shard(0))");
  const bool fsdp2 = c.fsdp.api == 2;
  if (ImGui::BeginCombo("sharding", sharding_name(c.fsdp.sharding))) {
    for (Sharding sh : kAllShardings) {
      const bool refused = fsdp2 && sh != Sharding::FullShard && sh != Sharding::Hybrid;
      Refused r(refused ? "FSDP1's; fully_shard shards fully or as HSDP (its reshard setting below is SHARD_GRAD_OP's)" : "");
      if (ImGui::Selectable(sharding_name(sh), c.fsdp.sharding == sh) && c.fsdp.sharding != sh) {
        c.fsdp.sharding = sh, changed = true;
        // HYBRID_SHARD needs node groups: start with two nodes when the world splits evenly.
        c.fsdp.node_size = sh != Sharding::Hybrid ? 0 : c.world_size % 2 == 0 ? c.world_size / 2 : 1;
      }
    }
    ImGui::EndCombo();
  }
  if (fsdp2) {
    // reshard_after_forward: true, false, or a divisor of the ranks a parameter is sharded over.
    const int shard = c.fsdp.sharding == Sharding::Hybrid && c.fsdp.node_size > 0 ? c.fsdp.node_size : c.world_size;
    if (c.fsdp.reshard_after_forward > 1 && shard % c.fsdp.reshard_after_forward != 0) c.fsdp.reshard_after_forward = kReshardTrue;
    if (ImGui::BeginCombo("reshard", reshard_after_forward_text(c.fsdp.reshard_after_forward).c_str())) {
      std::vector<int> choices = {kReshardTrue, 0};
      for (int n = 2; n < shard; n++)
        if (shard % n == 0) choices.push_back(n);
      for (int n : choices)
        if (ImGui::Selectable(reshard_after_forward_text(n).c_str(), c.fsdp.reshard_after_forward == n) && c.fsdp.reshard_after_forward != n)
          c.fsdp.reshard_after_forward = n, changed = true;
      ImGui::EndCombo();
    }
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("reshard_after_forward: true frees a unit after its forward, false keeps it to its backward,\n"
                        "N keeps a 1/N shard so the backward all-gathers inside groups of N ranks");
    int ahead = c.fsdp.prefetch;
    ImGui::SliderInt("prefetch units", &ahead, 1, 4);
    if (ImGui::IsItemDeactivatedAfterEdit()) c.fsdp.prefetch = ahead, changed = true;
  }
  if (c.fsdp.sharding == Sharding::Hybrid) {
    // Only divisors of the world make equal node groups.
    std::vector<int> sizes;
    for (int k = 1; k <= c.world_size; k++)
      if (c.world_size % k == 0) sizes.push_back(k);
    const std::string cur = std::to_string(c.fsdp.node_size) + " ranks per node";
    if (ImGui::BeginCombo("node size", cur.c_str())) {
      for (int k : sizes)
        if (ImGui::Selectable((std::to_string(k) + " ranks per node").c_str(), k == c.fsdp.node_size) && k != c.fsdp.node_size)
          c.fsdp.node_size = k, changed = true;
      ImGui::EndCombo();
    }
  }
  const char* wraps[] = {"per layer", "whole model"};
  int wi = c.fsdp.wrap_layers ? 0 : 1;
  if (ImGui::Combo("wrap", &wi, wraps, 2)) c.fsdp.wrap_layers = wi == 0, changed = true;
  const BackwardPrefetch prefetches[] = {BackwardPrefetch::None, BackwardPrefetch::Pre, BackwardPrefetch::Post};
  // "bwd prefetch": torch's backward_prefetch, its name short enough for the Run panel at 1280x720.
  const bool open = ImGui::BeginCombo("bwd prefetch", backward_prefetch_name(c.fsdp.backward_prefetch));
  if (ImGui::IsItemHovered() && !open)
    ImGui::SetTooltip("backward_prefetch: when the next unit's all-gather is issued in backward\n"
                      "(BACKWARD_PRE: before this unit's gradient computation; BACKWARD_POST: after it)");
  if (open) {
    for (BackwardPrefetch bp : prefetches) {
      Refused r(fsdp2 && bp == BackwardPrefetch::Post ? "FSDP1's; fully_shard prefetches in the pre-backward hook" : "");
      if (ImGui::Selectable(backward_prefetch_name(bp), c.fsdp.backward_prefetch == bp) && c.fsdp.backward_prefetch != bp)
        c.fsdp.backward_prefetch = bp, changed = true;
    }
    ImGui::EndCombo();
  }
  if (ImGui::Checkbox("forward prefetch", &c.fsdp.forward_prefetch)) changed = true;
  return changed;
}

// Tensor parallelism, mixed precision, LoRA and activation checkpointing: the options any strategy
// may run with, each greyed out with the reason where this run refuses it.
bool feature_controls(TrainConfig& c) {
  bool changed = false;
  {
    Refused r(refusal_of(c, Feature::TensorParallel));
    if (ImGui::BeginCombo("tensor parallel", off_or(c.tp, "tp ").c_str())) {
      for (int tp : {1, 2, 4})
        if (ImGui::Selectable(off_or(tp, "tp ").c_str(), c.tp == tp) && c.tp != tp) {
          c.tp = tp, changed = true;
          if (tp == 1) c.sequence_parallel = false;
          if (c.world_size % tp != 0) c.world_size = tp * std::max(1, c.world_size / tp);
        }
      ImGui::EndCombo();
    }
  }
  {
    Refused r(c.tp == 1 ? "sequence parallelism splits activations across the tensor-parallel group; pick tp 2 or 4 first"
                        : refusal_of(c, Feature::SequenceParallel));
    if (ImGui::Checkbox("sequence parallel", &c.sequence_parallel)) changed = true;
  }
  {
    Refused r(refusal_of(c, Feature::MixedPrecision));
    if (ImGui::BeginCombo("precision", precision_name(c.precision))) {
      for (Precision p : {Precision::FP32, Precision::BF16, Precision::FP16})
        if (ImGui::Selectable(precision_name(p), c.precision == p) && c.precision != p) {
          c.precision = p, changed = true;
          if (!is_mixed(p)) c.reduce_fp32 = false, c.inject_overflow_steps.clear();
        }
      ImGui::EndCombo();
    }
  }
  {
    Refused r(refusal_of(c, Feature::Lora));
    if (ImGui::BeginCombo("LoRA", off_or(c.lora.rank, "rank ").c_str())) {
      for (int rank : {0, 2, 4, 8})
        if (ImGui::Selectable(off_or(rank, "rank ").c_str(), c.lora.rank == rank) && c.lora.rank != rank) {
          c.lora.rank = rank, changed = true;
          if (rank == 0) c.merge_lora = false;
        }
      ImGui::EndCombo();
    }
  }
  {
    Refused r(refusal_of(c, Feature::Recompute));
    if (ImGui::Checkbox("activation checkpointing", &c.activation_checkpointing)) changed = true;
  }
  return changed;
}

bool optimizer_and_hardware_controls(TrainConfig& c) {
  bool changed = false;
  const char* opts[] = {"sgd", "adamw"};
  int oi = c.optimizer.kind == OptimizerKind::AdamW ? 1 : 0;
  if (ImGui::Combo("optimizer", &oi, opts, 2)) c.optimizer = default_optimizer_config(parse_optimizer_kind(opts[oi])), changed = true;
  static const std::vector<std::string> names = profile_names();
  if (ImGui::BeginCombo("hardware", c.profile.c_str())) {
    for (const std::string& name : names)
      if (ImGui::Selectable(name.c_str(), c.profile == name) && c.profile != name) c.profile = name, changed = true;
    ImGui::EndCombo();
  }
  return changed;
}

// What runs now, in words, under the controls.
void run_summary(const RunConfigView& rc) {
  ImGui::TextWrapped("%s on %s, %s; effective batch %lld", rc.model.c_str(), rc.data.c_str(), rc.optimizer.c_str(),
                     static_cast<long long>(rc.batch * rc.world * rc.accum));
  if (rc.strategy == Strategy::Fsdp)
    ImGui::TextWrapped("FSDP %s over %d ranks, units: %s", sharding_name(rc.sharding), rc.world,
                       rc.wrap_layers ? "one per Linear" : "the whole model");
  if (rc.strategy == Strategy::Dp)
    ImGui::TextWrapped("DataParallel: rank 0 loads batches of %lld, scatters %lld to each of %d devices, broadcasts the "
                       "parameters every forward and alone holds the optimizer", static_cast<long long>(rc.batch * rc.world),
                       static_cast<long long>(rc.batch), rc.world);
  ImGui::TextWrapped("device %s, backend %s: %s", rc.device.c_str(), rc.backend.c_str(), backend_words(rc).c_str());
  // An attached run's controls are greyed out and show only some settings; these are all it changed.
  if (!rc.attached.empty() && ImGui::TreeNode("Launched with")) {
    for (const auto& [flag, value] : rc.settings) ImGui::BulletText("%s %s", flag.c_str(), value.c_str());
    ImGui::TreePop();
  }
  // Wrapped: one line of every key was 1085 pixels wide, cut off in a 290-pixel panel.
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("Space run/pause  R ring step  C collective  F layer  B gradient  I iteration  A pipeline action  "
                      "Bksp reset  1-9 one view  0 all  P presentation  F11 full screen  M clock  L lessons  "
                      "N lesson: next step  H start screen");
  ImGui::PopTextWrapPos();
}

void App::config_panel() {
  // A narrow tile (all views beside a lesson at 1280 x 720) scrolls sideways to the labels, not cuts them.
  ImGui::Begin("Run", nullptr, ImGuiWindowFlags_HorizontalScrollbar);
  // Room on the right for the longest label: a pipeline's "micro-batches m" (FSDP's "bwd prefetch" is shorter).
  // (The window's inner rectangle, which leaves out the scrollbar whether or not it was shown last frame.)
  ImGuiWindow* run_window = ImGui::GetCurrentWindow();
  const float run_w = run_window->InnerRect.GetWidth() - 2 * ImGui::GetStyle().WindowPadding.x - ImGui::GetStyle().ScrollbarSize;
  ImGui::PushItemWidth(std::max(ImGui::GetFontSize() * 6, run_w - ImGui::CalcTextSize("micro-batches m").x - ImGui::GetStyle().ItemInnerSpacing.x));
  const RunConfigView& run = session_->snapshot().config;
  if (!run.attached.empty())
    ImGui::TextWrapped("Attached to a launched run at %s: %d processes. Its settings are the launch command's; the "
                       "controls pause and step all of its ranks.", run.attached.c_str(), run.world);
  ImGui::BeginDisabled(!run.attached.empty());
  TrainConfig& c = edit_;
  bool changed = strategy_controls(c);
  if (c.strategy == Strategy::Pipeline) {
    PipelineRequest r = pipeline_request_of(c);
    if (pipeline_controls(r, false)) apply_pipeline_request(c, r), changed = true;
  } else if (c.strategy != Strategy::Fsdp) {  // fsdp shows its own options instead of DDP's buckets
    changed |= ddp_controls(c);
  } else {
    changed |= fsdp_controls(c);
  }
  changed |= feature_controls(c);
  changed |= optimizer_and_hardware_controls(c);
  int clock = ctx_.modeled_clock ? 0 : 1;
  if (ImGui::RadioButton("modeled clock", &clock, 0)) ctx_.modeled_clock = true;
  ImGui::SameLine();
  if (ImGui::RadioButton("wall clock", &clock, 1)) ctx_.modeled_clock = false;
  if (changed) {
    c.start_paused = session_->paused();
    restart(c);
    edit_ = session_->config();
  }
  ImGui::EndDisabled();
  if (!config_error_.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 90, 90, 255));
    ImGui::TextWrapped("%s", config_error_.c_str());
    ImGui::PopStyleColor();
  }
  ImGui::Separator();
  run_summary(session_->snapshot().config);
  ImGui::PopItemWidth();
  ImGui::End();
}

// Covers the current window's contents: its view would show a pending question's answer.
void App::cover_view() {
  const ImVec2 avail = ImGui::GetContentRegionAvail(), at = ImGui::GetCursorScreenPos();
  const char* l1 = "Hidden until you check";
  const char* l2 = "(it shows the answer)";
  const ImVec2 s1 = ImGui::CalcTextSize(l1), s2 = ImGui::CalcTextSize(l2);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->AddRectFilled(at, ImVec2(at.x + avail.x, at.y + avail.y), ImGui::GetColorU32(ImGuiCol_FrameBg));
  dl->AddText(ImVec2(at.x + (avail.x - s1.x) * 0.5f, at.y + avail.y * 0.5f - s1.y), ImGui::GetColorU32(ImGuiCol_Text), l1);
  dl->AddText(ImVec2(at.x + (avail.x - s2.x) * 0.5f, at.y + avail.y * 0.5f + 0.2f * s2.y),
              ImGui::GetColorU32(ImGuiCol_TextDisabled), l2);
}

void App::views() {
  if (traces_.active()) return trace_views();
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float top = vp->WorkPos.y + (toolbar_h_ > 0 ? toolbar_h_ : ImGui::GetFrameHeightWithSpacing() * 1.5f);
  float W = vp->WorkSize.x, x0 = vp->WorkPos.x;
  const float H = vp->WorkPos.y + vp->WorkSize.y - top;
  if (show_lessons_) {  // the lesson panel takes the left of the work area; the views share the rest
    const float lw = std::round(W * (presentation_ ? 0.40f : 0.30f));
    lesson_panel(ImVec2(x0, top), ImVec2(lw, H));
    x0 += lw, W -= lw;
  }
  struct Rect { float x, y, w, h; };
  // The tiled layout: run settings and the collective inspector on the left, ring and buckets in
  // the middle, memory on the right, timeline and data along the bottom.
  const Rect tiles[kNumViews] = {
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // ring
      {x0 + 0.60f * W, top, 0.40f * W, 0.27f * H},             // buckets (its rows scroll)
      {x0 + 0.20f * W, top + 0.56f * H, 0.55f * W, 0.44f * H},  // timeline
      {x0 + 0.60f * W, top + 0.27f * H, 0.40f * W, 0.29f * H},  // memory (its bars whole)
      {x0, top + 0.42f * H, 0.20f * W, 0.58f * H},              // inspector
      {x0 + 0.75f * W, top + 0.56f * H, 0.25f * W, 0.44f * H},  // data
      {x0 + 0.60f * W, top, 0.40f * W, 0.27f * H},             // shards: the buckets' place (FSDP has no buckets)
      {x0 + 0.20f * W, top, 0.48f * W, 0.56f * H},             // pipeline: the ring's place, wider (its header wraps less)
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // topology: shown alone (its key or `view topology`)
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // sweep: shown alone (view sweep), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // mesh: shown alone (view mesh), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // sizing: shown alone (view sizing), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // roofline: shown alone (view roofline), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // experts: shown alone (view experts), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // all-to-all: shown alone (view alltoall), never tiled
      {x0 + 0.20f * W, top, 0.40f * W, 0.56f * H},             // context: shown alone (view context), never tiled
  };
  const Rect run_tile = {x0, top, 0.20f * W, 0.42f * H};
  // Presentation, all views: the four pictures a class reads from the back of the room, each with
  // room for presentation's large type (seven tiles at that size cut every one of them); the Run
  // panel, the Collective inspector and Data are a number key away, or back with P.
  const bool stage = presentation_ && solo_ < 0;
  auto stage_tile = [&](int v, bool pipeline) -> Rect {
    constexpr float kTop = 0.55f;  // the bottom row's timeline and memory need their rows whole
    if (pipeline && v == kPipeline) return {x0, top, W, 0.64f * H};  // its chart under its header and plan
    if (pipeline) return {v == kTimeline ? x0 : x0 + 0.62f * W, top + 0.64f * H, (v == kTimeline ? 0.62f : 0.38f) * W, 0.36f * H};
    if (v == kRing) return {x0, top, 0.55f * W, kTop * H};
    if (v == kBuckets || v == kShards) return {x0 + 0.55f * W, top, 0.45f * W, kTop * H};
    if (v == kTimeline) return {x0, top + kTop * H, 0.62f * W, (1 - kTop) * H};
    return {x0 + 0.62f * W, top + kTop * H, 0.38f * W, (1 - kTop) * H};  // memory
  };
  if (stage != was_stage_) was_stage_ = stage, relayout_ = true;
  // A/B comparison, tiled: the Run panel over the differences table on the left, the timeline (a
  // pipeline's chart) down the middle, buckets (shards, the timeline) over memory on the right, each
  // window split A above B. The ring, the collective and the data are a number key away.
  const bool comparing = compare_.active(), compare_inline = comparing && solo_ >= 0;
  if (comparing != was_compare_) was_compare_ = comparing, relayout_ = true;
  const bool pipeline_run = session_->snapshot().pipeline.valid;
  auto compare_tile = [&](int v) -> Rect {
    const float lw = 0.24f * W, mw = 0.42f * W, rw = W - lw - mw;
    if (v == (pipeline_run ? kPipeline : kTimeline)) return {x0 + lw, top, mw, H};
    if (v == kMemory) return {x0 + lw + mw, top + 0.5f * H, rw, 0.5f * H};
    return {x0 + lw + mw, top, rw, 0.5f * H};  // buckets, shards; a pipeline's timeline
  };
  if (was_pipeline_ != session_->snapshot().pipeline.valid) was_pipeline_ = !was_pipeline_, relayout_ = true;
  const ImGuiCond cond = relayout_ ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  if (solo_ < 0 && !stage) {
    ImGui::SetNextWindowPos(ImVec2(run_tile.x, run_tile.y), cond);
    ImGui::SetNextWindowSize(ImVec2(comparing ? 0.24f * W : run_tile.w, run_tile.h), cond);
    config_panel();
  }
  // The differences table: in the collective inspector's place; in presentation, in the ring's (a
  // pipeline's memory's, under the pipeline's chart).
  const bool pipeline_now = session_->snapshot().pipeline.valid;
  if (comparing && !compare_inline) {
    const Rect t = stage ? stage_tile(pipeline_now ? kMemory : kRing, pipeline_now) : Rect{x0, top + run_tile.h, 0.24f * W, H - run_tile.h};
    ImGui::SetNextWindowPos(ImVec2(t.x, t.y), cond);
    ImGui::SetNextWindowSize(ImVec2(t.w, t.h), cond);
    ImGui::Begin("A/B comparison");
    bool unpin = false;
    draw_compare_table(compare_, session_->snapshot(), unpin);
    ImGui::End();
    if (unpin) unpin_run();
  }
  const Snapshot& s = session_->snapshot();
  bool set_epoch = ctx_.data_set_epoch;
  const bool fsdp = s.config.strategy == Strategy::Fsdp, pipeline = s.pipeline.valid;
  // No spoilers: a view drawing a figure the pending question asks about is covered until Check.
  bool hidden[kNumViews] = {};
  for (const std::string& f : lessons_.pending_figures())
    for (const std::string& name : views_drawing(f))
      for (int v = 0; v < kNumViews; v++) hidden[v] = hidden[v] || name == kViewNames[v];
  for (int v = 0; v < kNumViews; v++) {
    if (solo_ >= 0 && solo_ != v) continue;
    // Tiled, FSDP's shard map takes the buckets' tile; DDP and single runs keep the buckets.
    if (solo_ < 0 && ((v == kBuckets && fsdp) || (v == kShards && !fsdp))) continue;
    // A pipeline has no collective for the ring to draw and no buckets: the pipeline view takes
    // the ring's tile, the memory view (activations per stage) grows into the buckets'.
    if (solo_ < 0 && ((v == kRing && pipeline) || (v == kPipeline && !pipeline) || (v == kBuckets && pipeline))) continue;
    // No tile of their own: a picture of the machine, and a plot over sizes, want the whole window.
    if (solo_ < 0 && (v == kTopology || v == kSweep || v == kMesh || v == kSizing || v == kRoofline || v == kExperts || v == kAllToAll || v == kContext)) continue;
    if (stage && (v == kInspector || v == kData)) continue;
    if (comparing && !compare_inline && !compared(v)) continue;  // a number key away
    if (comparing && stage && pipeline && v == kMemory) continue;   // the table has its tile
    const Rect t = comparing && !stage ? compare_tile(v)
                   : stage ? stage_tile(v, pipeline)
                   : pipeline && v == kMemory ? Rect{x0 + 0.68f * W, top, 0.32f * W, 0.56f * H} : tiles[v];
    if (solo_ == v) {
      ImGui::SetNextWindowPos(ImVec2(x0, top), ImGuiCond_Always);
      ImGui::SetNextWindowSize(ImVec2(W, H), ImGuiCond_Always);
    } else {
      ImGui::SetNextWindowPos(ImVec2(t.x, t.y), cond);
      ImGui::SetNextWindowSize(ImVec2(t.w, t.h), cond);
    }
    // The Collective inspector's key/value rows in a narrow tile (all views beside a lesson at 1280 x 720)
    // scroll sideways rather than wrap a glyph a line.
    const ImGuiWindowFlags scroll = v == kInspector && solo_ != v ? ImGuiWindowFlags_HorizontalScrollbar : 0;
    ImGui::Begin(kViewTitles[v], nullptr, (solo_ == v ? ImGuiWindowFlags_NoSavedSettings : 0) | scroll);
    if (hidden[v]) {  // the view would show the answer of the question waiting for Check
      cover_view();
      ImGui::End();
      continue;
    }
    if (compared(v)) {  // A above B, on one scale; the differences table on top when it has no window of its own
      if (compare_inline && (v == kTimeline || solo_ == v)) {
        bool unpin = false;
        draw_compare_table(compare_, s, unpin);
        if (unpin) unpin_run();
        ImGui::Separator();
      }
      if (v == kTimeline) draw_timeline_compared(compare_, s, timeline_view_, ctx_);
      else if (v == kMemory) draw_memory_compared(compare_, s, memory_view_, ctx_);
      else if (v == kPipeline) draw_pipeline_compared(compare_, s, pipeline_view_, ctx_);
      else draw_buckets_compared(compare_, s, ctx_, v == kShards);
      ImGui::End();
      continue;
    }
    switch (v) {
      case kRing: draw_ring_view(s, ctx_, ring_view_); break;
      case kBuckets: draw_bucket_view(s, ctx_); break;
      case kTimeline: draw_timeline_view(s, timeline_view_, ctx_); break;
      case kMemory: draw_memory_view(s, memory_view_, ctx_); break;
      case kInspector: draw_inspector_view(s, ctx_); break;
      case kData: draw_data_view(s, data_view_, ctx_); break;
      case kShards: draw_shard_view(s, ctx_); break;
      case kPipeline: draw_pipeline_view(s, ctx_, pipeline_view_); break;
      case kTopology: draw_topology_view(s, ctx_); break;
      case kSweep: draw_sweep_view(s, ctx_); break;
      case kMesh: draw_mesh_view(s, ctx_); break;
      case kSizing: draw_sizing_view(s, ctx_, sizing_view_); break;
      case kRoofline: draw_roofline_view(s, ctx_); break;
      case kExperts: draw_experts_view(s, ctx_, experts_view_); break;
      case kAllToAll: draw_alltoall_view(s, ctx_, alltoall_view_); break;
      case kContext: draw_context_view(s, ctx_, context_view_); break;
    }
    ImGui::End();
  }
  if (ctx_.data_set_epoch != set_epoch) session_->set_data_set_epoch(ctx_.data_set_epoch);
  refresh_attention();
  if (data_view_.generate.request) {  // the data view's Generate button
    data_view_.generate.request = false;
    generate_text(data_view_.generate.prompt);
  }
  if (ctx_.focus_request) {  // the mesh view's click: every view follows that rank or group
    ctx_.focus_request = false;
    session_->set_focus(ctx_.focus_rank, ctx_.focus_group);
  }
  if (ctx_.pipeline_restart) {  // the pipeline view's controls, applied as the Run panel's
    ctx_.pipeline_restart = false;
    TrainConfig c = session_->config();
    apply_pipeline_request(c, ctx_.pipeline);
    c.start_paused = session_->paused();
    restart(c);
    ctx_.restart_error = config_error_;
    edit_ = session_->config();
  }
  if (ctx_.sizing_restart) {  // the Sizing view's layout, scaled down, as `compare` applies flags
    ctx_.sizing_restart = false;
    TrainConfig c = session_->config();
    try {
      apply_compare_flags(c, ctx_.sizing_flags);
      c.start_paused = session_->paused();
      restart(c);
    } catch (const Error& e) {
      config_error_ = e.what();
    }
    ctx_.restart_error = config_error_;
    sizing_view_.ran = true;
    edit_ = session_->config();
  }
  relayout_ = false;
}

void App::lesson_panel(ImVec2 pos, ImVec2 size) {
  ImGui::SetNextWindowPos(pos, ImGuiCond_Always);
  ImGui::SetNextWindowSize(size, ImGuiCond_Always);
  ImGui::Begin("Lesson", nullptr, ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoCollapse |
                                      ImGuiWindowFlags_NoSavedSettings);
  const LessonPanel panel{lessons_.runner(), &lessons_.catalog(), lessons_.error(), !script_->scripted() && script_->busy()};
  for (const std::string& cmd : draw_lesson_view(panel, lesson_view_, session_->snapshot(), ctx_)) {
    lessons_.set_error("");
    if (cmd == "close") {
      lessons_.close();
      continue;
    }
    script_->queue_lesson(cmd);
  }
  ImGui::End();
}

// ---- --open: the imported-trace viewer. The loader reads on its own thread; each frame polls it once.

void App::trace_toolbar() {
  begin_toolbar();
  const TraceSnapshot& t = traces_.snapshot();
  const float fs = ImGui::GetFontSize();
  if (t.load == TaskState::Running) {
    char overlay[32];
    std::snprintf(overlay, sizeof overlay, "%.0f%%", 100 * t.fraction);
    ImGui::ProgressBar(static_cast<float>(t.fraction), ImVec2(8 * fs, 0), overlay);
    ImGui::SameLine();
    if (ImGui::Button("Cancel")) traces_.cancel();
  } else {
    if (ImGui::Button("Reload")) traces_.reopen();
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Read the trace files again");
  }
  ImGui::SameLine();
  if (ImGui::Checkbox("Presentation (P)", &presentation_)) {
    apply_style();
    relayout_ = true;
  }
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Large fonts and high contrast, for a projector; F11: full screen");
  ImGui::SameLine();
  view_combo(kTraceViewTitles, kNumTraceViews);
  const std::string line = trace_summary(t);
  flow(ImGui::CalcTextSize(line.c_str()).x, 1.2f * fs);
  ImGui::TextUnformatted(line.c_str());
  end_toolbar(toolbar_h_, relayout_);
}

void App::trace_views() {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float top = vp->WorkPos.y + (toolbar_h_ > 0 ? toolbar_h_ : ImGui::GetFrameHeightWithSpacing() * 1.5f);
  float W = vp->WorkSize.x, x0 = vp->WorkPos.x;
  const float H = vp->WorkPos.y + vp->WorkSize.y - top;
  if (show_lessons_ && session_) {  // a lesson reading a trace: its panel on the left, as beside a run
    const float lw = std::round(W * (presentation_ ? 0.40f : 0.30f));
    lesson_panel(ImVec2(x0, top), ImVec2(lw, H));
    x0 += lw, W -= lw;
  }
  // No spoilers: the panels showing what the pending question asks are covered until Check.
  bool hidden[kNumTraceViews] = {};
  for (const std::string& f : lessons_.pending_figures())
    for (const std::string& name : views_drawing(f))
      for (int v = 0; v < kNumTraceViews; v++) hidden[v] = hidden[v] || name == kTraceViewNames[v];
  // The timeline across the top; below it the collectives, the breakdown and the comparison.
  struct Rect { float x, y, w, h; };
  const Rect tiles[kNumTraceViews] = {
      {x0, top, W, 0.56f * H},
      {x0, top + 0.56f * H, 0.38f * W, 0.44f * H},
      {x0 + 0.38f * W, top + 0.56f * H, 0.32f * W, 0.44f * H},
      {x0 + 0.70f * W, top + 0.56f * H, 0.30f * W, 0.44f * H},
  };
  const ImGuiCond cond = relayout_ ? ImGuiCond_Always : ImGuiCond_FirstUseEver;
  for (int v = 0; v < kNumTraceViews; v++) {
    if (solo_ >= 0 && solo_ != v) continue;
    const Rect t = solo_ == v ? Rect{x0, top, W, H} : tiles[v];
    ImGui::SetNextWindowPos(ImVec2(t.x, t.y), solo_ == v ? ImGuiCond_Always : cond);
    ImGui::SetNextWindowSize(ImVec2(t.w, t.h), solo_ == v ? ImGuiCond_Always : cond);
    const std::string title = std::string(kTraceViewTitles[v]) + "###trace_" + kTraceViewNames[v];
    ImGui::Begin(title.c_str(), nullptr, solo_ == v ? ImGuiWindowFlags_NoSavedSettings : 0);
    if (hidden[v]) {
      cover_view();
      ImGui::End();
      continue;
    }
    switch (v) {
      case kTraceTimeline: draw_trace_timeline(traces_.snapshot(), traces_.ui(), ctx_); break;
      case kTraceCollectives: draw_trace_collectives(traces_.snapshot(), traces_.ui(), ctx_); break;
      case kTraceBreakdown: draw_trace_breakdown(traces_.snapshot(), traces_.ui(), ctx_); break;
      case kTraceCompare: draw_trace_compare(traces_.snapshot(), traces_.ui(), ctx_); break;
    }
    ImGui::End();
  }
  relayout_ = false;
  traces_.after_draw();  // what the panels asked for
}

void App::show_view(const std::string& name) {
  solo_ = -1;
  if (traces_.active()) {
    for (int v = 0; v < kNumTraceViews; v++)
      if (name == kTraceViewNames[v] || (name == "inspector" && v == kTraceCollectives)) solo_ = v;
  } else {
    for (int v = 0; v < kNumViews; v++)
      if (name == kViewNames[v]) solo_ = v;
  }
  relayout_ = true;
}

void App::set_context_block(int block, bool backward) {
  context_view_.follow = block < 0;
  if (block >= 0) context_view_.block = block, context_view_.backward = backward;
  show_view("context");
}

void App::set_sizing(const std::string& spec) {
  if (spec == "run") {  // as the view's "Run it scaled down"; applied after the next frame's views
    ctx_.sizing_restart = true;
    ctx_.sizing_flags = sizing_mirror_flags(sizing_view_.input);
    return;
  }
  sizing_view_.input = parse_sizing_spec(spec);  // the script's parser checked it
  show_view("sizing");
}

void App::set_presentation(bool on) {
  presentation_ = on;
  apply_style();
  relayout_ = true;
}

// The data view's attention grid: read again when the run stood still at a new place or another
// block or head was chosen (Session::attention), cleared while it moves.
void App::refresh_attention() {
  AttentionBox& a = data_view_.attention;
  const TrainConfig& c = session_->config();
  if (!c.model.is_gpt()) return;
  a.layers = static_cast<int>(c.model.gpt.layers);
  a.heads = static_cast<int>(c.model.gpt.heads);
  a.layer = std::clamp(a.layer, 0, a.layers - 1);
  a.head = std::clamp(a.head, 0, a.heads - 1);
  // The grid reads rank 0's whole model after its forward: a pipeline's blocks run on its stages, and
  // checkpointing keeps no block's probabilities.
  a.why_none = c.strategy == Strategy::Pipeline
                   ? "A pipeline runs the blocks on its stages' ranks, one micro-batch at a time; the grid reads one rank's whole "
                     "model, so it shows single, ddp and fsdp runs."
               : c.activation_checkpointing
                   ? "Activation checkpointing keeps no block's attention probabilities (the backward computes them again); run "
                     "without it to see the pattern."
               : c.cp > 1
                   ? "--cp splits each sample over ranks: the Context view draws each one's part."  // rank 0 holds its queries' rows only
                   : "";
  if (!a.why_none.empty()) {
    a.probs.clear();
    return;
  }
  const Snapshot& s = session_->snapshot();
  const uint64_t key = (s.stepper.generation * 1024 + static_cast<uint64_t>(a.layer)) * 1024 + static_cast<uint64_t>(a.head) + 1;
  if (key == a.key) return;
  if (!session_->attention(a.layer, a.head, a.probs, a.text)) {
    a.probs.clear();
    return;  // read again next frame: the run may settle
  }
  a.key = key;
  a.at_step = s.step;
}

std::string App::generate_text(const std::string& prompt) {
  GenerateBox& g = data_view_.generate;
  g.error.clear();
  try {
    g.output = session_->generate(prompt, 240);
    g.asked = prompt;
    g.at_step = session_->snapshot().step;
  } catch (const Error& e) {
    g.error = e.what();
  }
  return g.error;
}

void App::set_data_set_epoch(bool on) {
  ctx_.data_set_epoch = on;
  session_->set_data_set_epoch(on);
}

// A lesson command may have restarted the run (the Run panel shows its configuration) and applied
// a scenario that opens traces.
void App::lesson_ran() {
  edit_ = session_->config();
  if (traces_.sync_lesson(lessons_.runner(), *session_)) relayout_ = true;
}

std::string App::start_off_path() const {
  const std::string dir = config_dir(opt_);
  return dir.empty() ? "" : dir + "/start-screen-off";
}

void App::start_screen(const std::string& what) {
  StartScenario sc{};
  if (what == "on" || what == "off") show_start_ = what == "on";
  else if (what == "course") start_choice(StartChoice::Course, false);
  else if (parse_start_scenario(what, sc))
    start_choice(sc == StartScenario::DdpOverlap ? StartChoice::DdpOverlap
                 : sc == StartScenario::FsdpMemory ? StartChoice::FsdpMemory : StartChoice::PipelineBubble,
                 false);  // the script runner steps its iterations, waiting for each
}

// A click on the start screen: a scenario restarts the run and (clicked by a person) steps its
// first iterations, so the idea is on screen at once; the course opens the lesson panel.
void App::start_choice(StartChoice choice, bool step_iterations) {
  show_start_ = false;
  if (choice == StartChoice::Course) {
    show_lessons_ = relayout_ = true;
    return;
  }
  if (choice == StartChoice::Close || choice == StartChoice::None) return;
  const StartScenario sc = choice == StartChoice::DdpOverlap   ? StartScenario::DdpOverlap
                           : choice == StartChoice::FsdpMemory ? StartScenario::FsdpMemory
                                                               : StartScenario::PipelineBubble;
  solo_ = -1;
  relayout_ = true;
  restart(start_scenario_config(sc));
  edit_ = session_->config();
  if (step_iterations)
    for (int i = 0; i < start_scenario_iterations(sc); i++) session_->step(GateKind::Iteration);  // steps add up
}

void App::frame(bool present) {
  glfwPollEvents();
  follow_content_scale();
  traces_.poll();
  if (session_) {
    if (traces_.active()) session_->set_trace(traces_.loaded());
    session_->update();
  }
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  // Scripted runs own no mouse: Xvfb's pointer rests mid-screen and would leave a tooltip in every
  // screenshot.
  if (!opt_.script.empty() || !opt_.screenshot.empty() || opt_.bench_frames || opt_.play)
    ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
  ImGui::NewFrame();
  ctx_.time = glfwGetTime() - start_time_;
  handle_keys();
  if (traces_.active()) trace_toolbar();
  else toolbar();
  // The lesson list follows the files on disk: read here, once the keys and the toolbar have said
  // whether the panel shows, and never by the panel itself.
  lessons_.update(show_lessons_ && session_);
  views();
  if (show_start_) {
    const bool was = start_at_launch_;
    const StartChoice choice = draw_start_screen(start_at_launch_, presentation_);
    if (start_at_launch_ != was) {  // remembered in the config directory
      std::error_code ec;
      if (start_at_launch_) std::filesystem::remove(start_off_path(), ec);
      else if (!start_off_path().empty()) std::ofstream(start_off_path()) << "the start screen stays closed at start (H opens it)\n";
    }
    if (choice != StartChoice::None) start_choice(choice, true);
  }
  ImGui::Render();
  spoilers_.after_render(*ImGui::GetDrawData());
  if (shots_.layout_check_due()) {  // `check layout`: what this frame cut off
    const std::vector<ClippedWindow> clipped = clipped_windows();
    const std::vector<TextFault> text = text_faults();
    int w = 0, h = 0;
    glfwGetWindowSize(win_, &w, &h);
    const size_t faults = clipped.size() + text.size();
    std::printf("layout (%dx%d, scale %.2g%s): %s\n", w, h, static_cast<double>(scale_), presentation_ ? ", presentation" : "",
                faults == 0 ? "nothing cut off, no text over text" : (std::to_string(faults) + " faults").c_str());
    for (const ClippedWindow& c : clipped) std::printf("  %s\n", describe(c).c_str());
    for (const TextFault& t : text) std::printf("  %s\n", describe(t).c_str());
    std::fflush(stdout);
    if (faults > 0) outcome_.exit_code = 1;
  }
  if (!present) return;
  int w = 0, h = 0;
  glfwGetFramebufferSize(win_, &w, &h);
  glViewport(0, 0, w, h);
  glClearColor(0.06f, 0.06f, 0.07f, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  if (shots_.due() && !shots_.save(w, h, traces_.active() ? traces_.state_text() : run_state_text(session_->snapshot()))) {
    outcome_.exit_code = 1;
    outcome_.quit = true;
  }
  glfwSwapBuffers(win_);
}

int App::run() {
  if (!opt_.open.empty()) {  // the trace viewer: no training run (options.cpp refused the flags of one)
    traces_.create(opt_);
  } else {
    try {
      session_ = opt_.attach.empty() ? std::make_unique<Session>(opt_.train) : Session::attach(opt_.attach);
    } catch (const Error& e) {
      std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
      return 2;
    }
    edit_ = session_->config();
  }
  script_ = std::make_unique<ScriptRunner>(*this, session_.get(), lessons_, traces_, shots_, opt_.check_spoilers ? &spoilers_ : nullptr,
                                           outcome_, opt_.play);
  script_->start(opt_.script, !opt_.script.empty() || opt_.play);
  if (!opt_.lesson.empty()) {
    // A missing or unreadable --lesson is bad input: exit 2 before any window opens; so is any
    // error in a lesson to --play. A lesson with an error at a line opens, its panel showing the
    // error where its author edits it (a scripted run still ends with exit 2).
    try {
      load_lesson(opt_.lesson);
    } catch (const LessonError& e) {
      if (opt_.play || e.line == 0) {
        std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
        return 2;
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
      return 2;
    }
    ScriptCommand open;
    open.kind = ScriptCommand::Lesson;
    open.arg = "open " + opt_.lesson;
    script_->push_front(open);
  }
  // The frame benchmark measures a live run: the engine steps (slowly, so it shares the cores
  // fairly) while the views redraw.
  if (session_) {
    if (opt_.bench_frames && !opt_.running) opt_.running = true, opt_.speed = opt_.speed > 0 ? opt_.speed : 1e-4;
    if (opt_.running) session_->run(opt_.speed);
    else if (opt_.speed > 0) {
      session_->run(opt_.speed);
      session_->pause();
    }
  }
  // The start screen opens on a plain launch until its checkbox says no (kept in the config dir).
  start_at_launch_ = start_off_path().empty() || !std::filesystem::exists(start_off_path());
  show_start_ = opt_.plain && session_ && start_at_launch_;
  if (!init_window()) return 2;
  if (traces_.active()) traces_.load(opt_.open, opt_.trace_ranks);
  init_imgui();
  gl_ = std::make_unique<GlResources>(DTLAB_SHADER_DIR);
  ctx_.gl = gl_.get();
  ctx_.modeled_clock = opt_.modeled_clock;
  ctx_.pipeline_compare = opt_.compare;
  start_time_ = glfwGetTime();
  std::vector<double> cpu_ms, wall_ms;            // the benchmark's frames
  std::vector<double> load_cpu_ms, load_wall_ms;  // --open: the frames drawn while the traces loaded
  int frames = 0, bench_frames = 0;
  // A scripted run (--script, --run, --play) has no display's refresh to wait for, and drawing every
  // frame's pixels as fast as it can (under Xvfb, Mesa's llvmpipe: about 10 ms of CPU each) took two
  // thirds of a lesson's CPU from the ranks it waits for. Its frames still run the UI, the script
  // and the spoiler check as fast as they come; the pixels are drawn 10 times a second (30 still took
  // half a played lesson's CPU in llvmpipe), and on every frame while a screenshot is pending.
  const bool paced = script_->scripted() && opt_.bench_frames == 0;
  auto presented = Clock::now() - std::chrono::seconds(1);
  while (!glfwWindowShouldClose(win_) && !outcome_.quit) {
    const bool loading = traces_.loading();
    const double c0 = thread_cpu_seconds();
    const auto w0 = Clock::now();
    const bool present = !paced || shots_.pending() || w0 - presented >= std::chrono::milliseconds(100);
    if (present) presented = w0;
    frame(present);
    if (!present) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a frame of UI alone: leave the cores to the ranks
    frames++;
    (loading ? load_cpu_ms : cpu_ms).push_back((thread_cpu_seconds() - c0) * 1e3);
    (loading ? load_wall_ms : wall_ms).push_back(std::chrono::duration<double, std::milli>(Clock::now() - w0).count());
    bench_frames += loading ? 0 : 1;  // with --open, the benchmark's N frames draw the loaded trace
    if (frames >= 2 && !script_->tick() && !shots_.pending()) break;
    if (!opt_.screenshot.empty() && frames == opt_.frames) {
      shots_.request(opt_.screenshot, 1);
      frame();
      break;
    }
    if (opt_.bench_frames && bench_frames >= opt_.bench_frames) break;
  }
  if (opt_.bench_frames) {
    auto stats = [&](std::vector<double> v, double& med, double& p95) {
      // Skip the first frames (font atlas upload, first shader builds).
      v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(10, v.size() / 10)));
      std::sort(v.begin(), v.end());
      med = v.empty() ? 0 : v[v.size() / 2];
      p95 = v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * 95 / 100)];
    };
    double cm = 0, cp = 0, wm = 0, wp = 0;
    stats(cpu_ms, cm, cp);
    stats(wall_ms, wm, wp);
    const std::shared_ptr<const ImportedTrace> loaded = traces_.active() ? traces_.loaded() : nullptr;
    const int world = loaded ? static_cast<int>(loaded->ranks.size()) : opt_.train.world_size;
    std::printf("frame benchmark: %d frames, world %d, %dx%d: CPU ms per frame (UI thread) median %.2f, p95 %.2f; wall ms per frame median %.2f, p95 %.2f\n",
                bench_frames, world, opt_.width, opt_.height, cm, cp, wm, wp);
    if (traces_.active()) {  // the UI kept drawing while the traces loaded on their own thread
      traces_.poll();
      const TraceSnapshot& t = traces_.snapshot();
      stats(load_cpu_ms, cm, cp);
      stats(load_wall_ms, wm, wp);
      std::printf("trace load: %d files, %s, %s in %.2f s; %zu frames drawn while loading: wall ms per frame median %.2f, p95 %.2f; "
                  "CPU ms per frame median %.2f, p95 %.2f\n", t.files, human_bytes(t.bytes).c_str(), task_state_name(t.load),
                  t.elapsed_s, load_wall_ms.size(), wm, wp, cm, cp);
    }
  }
  traces_.close();   // cancels a load and joins its threads
  session_.reset();  // stops the engine before the GL context goes
  gl_.reset();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(win_);
  glfwTerminate();
  return outcome_.exit_code;
}

}  // namespace

int run_app(AppOptions& options) {
  App app(options);
  return app.run();
}

}  // namespace dtlab::app
