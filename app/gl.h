// Small OpenGL 3.3 helpers for the views' own rendering: GLSL programs loaded from shaders/ at run
// time (compile and link logs on failure), and render targets (a framebuffer with a color texture
// that ImGui::Image shows). A program that fails to build is logged once and reported as missing,
// so a view falls back to ImGui drawing and the app keeps running.
#pragma once
#include <map>
#include <string>

namespace dtlab::app {

class ShaderProgram {
 public:
  ShaderProgram() = default;
  ~ShaderProgram();
  ShaderProgram(const ShaderProgram&) = delete;
  ShaderProgram& operator=(const ShaderProgram&) = delete;
  // Compiles NAME.vert and NAME.frag from `dir`; on failure returns false with the log in `error`.
  bool load(const std::string& dir, const std::string& name, std::string& error);
  unsigned id() const { return id_; }
  int uniform(const char* name) const;  // -1 when absent
 private:
  unsigned id_ = 0;
};

class RenderTarget {
 public:
  RenderTarget() = default;
  ~RenderTarget();
  RenderTarget(const RenderTarget&) = delete;
  RenderTarget& operator=(const RenderTarget&) = delete;
  // (Re)allocates at w x h pixels when the size changed; binds it and sets the viewport. Call
  // end() to return to the default framebuffer (and the viewport that was set before).
  void begin(int w, int h);
  void end();
  unsigned texture() const { return tex_; }
  int width() const { return w_; }
  int height() const { return h_; }
 private:
  unsigned fbo_ = 0, tex_ = 0;
  int w_ = 0, h_ = 0;
  int saved_viewport_[4] = {0, 0, 0, 0};
  int saved_fbo_ = 0;
};

class GlResources {
 public:
  explicit GlResources(std::string shader_dir) : dir_(std::move(shader_dir)) {}
  // The program NAME (shaders/NAME.vert + .frag), built on first use; null if it failed (logged
  // once to stderr with the compiler's log).
  ShaderProgram* program(const std::string& name);
  RenderTarget& target(const std::string& name) { return targets_[name]; }
  const std::string& shader_dir() const { return dir_; }
 private:
  std::string dir_;
  std::map<std::string, ShaderProgram> programs_;
  std::map<std::string, bool> failed_;
  std::map<std::string, RenderTarget> targets_;
};

// AddressSanitizer builds (DTLAB_ASAN): keeps every library loaded now (the GL driver's, once a
// context exists) loaded until exit. glvnd unloads the driver at teardown, and LeakSanitizer's
// check at exit then cannot read the driver's globals or name its frames, so the driver's own
// allocations show up as "<unknown module>" leaks no suppression can match. Elsewhere a no-op.
void keep_libraries_loaded();

}  // namespace dtlab::app
