#include "app/gl.h"

#include <GL/gl.h>
#include <GL/glext.h>

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace dtlab::app {

namespace {

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

GLuint compile(GLenum kind, const std::string& path, std::string& error) {
  std::string src;
  if (!read_file(path, src)) {
    error = "cannot read " + path;
    return 0;
  }
  GLuint s = glCreateShader(kind);
  const char* text = src.c_str();
  glShaderSource(s, 1, &text, nullptr);
  glCompileShader(s);
  GLint ok = 0;
  glGetShaderiv(s, GL_COMPILE_STATUS, &ok);
  if (!ok) {
    char log[2048];
    glGetShaderInfoLog(s, sizeof log, nullptr, log);
    error = path + " does not compile: " + log;
    glDeleteShader(s);
    return 0;
  }
  return s;
}

}  // namespace

ShaderProgram::~ShaderProgram() {
  if (id_) glDeleteProgram(id_);
}

bool ShaderProgram::load(const std::string& dir, const std::string& name, std::string& error) {
  GLuint vs = compile(GL_VERTEX_SHADER, dir + "/" + name + ".vert", error);
  if (!vs) return false;
  GLuint fs = compile(GL_FRAGMENT_SHADER, dir + "/" + name + ".frag", error);
  if (!fs) {
    glDeleteShader(vs);
    return false;
  }
  GLuint p = glCreateProgram();
  glAttachShader(p, vs);
  glAttachShader(p, fs);
  glLinkProgram(p);
  glDeleteShader(vs);
  glDeleteShader(fs);
  GLint ok = 0;
  glGetProgramiv(p, GL_LINK_STATUS, &ok);
  if (!ok) {
    char log[2048];
    glGetProgramInfoLog(p, sizeof log, nullptr, log);
    error = "shader program " + name + " does not link: " + log;
    glDeleteProgram(p);
    return false;
  }
  id_ = p;
  return true;
}

int ShaderProgram::uniform(const char* name) const { return id_ ? glGetUniformLocation(id_, name) : -1; }

RenderTarget::~RenderTarget() {
  if (fbo_) glDeleteFramebuffers(1, &fbo_);
  if (tex_) glDeleteTextures(1, &tex_);
}

void RenderTarget::begin(int w, int h) {
  w = w < 1 ? 1 : w;
  h = h < 1 ? 1 : h;
  glGetIntegerv(GL_VIEWPORT, saved_viewport_);
  glGetIntegerv(GL_FRAMEBUFFER_BINDING, &saved_fbo_);
  if (!fbo_) {
    glGenFramebuffers(1, &fbo_);
    glGenTextures(1, &tex_);
  }
  if (w != w_ || h != h_) {
    w_ = w;
    h_ = h;
    glBindTexture(GL_TEXTURE_2D, tex_);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA8, w, h, 0, GL_RGBA, GL_UNSIGNED_BYTE, nullptr);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
    glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
    glFramebufferTexture2D(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_TEXTURE_2D, tex_, 0);
  }
  glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
  glViewport(0, 0, w, h);
}

void RenderTarget::end() {
  glBindFramebuffer(GL_FRAMEBUFFER, static_cast<GLuint>(saved_fbo_));
  glViewport(saved_viewport_[0], saved_viewport_[1], saved_viewport_[2], saved_viewport_[3]);
}

ShaderProgram* GlResources::program(const std::string& name) {
  auto it = programs_.find(name);
  if (it != programs_.end()) return &it->second;
  if (failed_.count(name)) return nullptr;
  std::string error;
  ShaderProgram& p = programs_[name];
  if (!p.load(dir_, name, error)) {
    programs_.erase(name);
    failed_[name] = true;
    std::fprintf(stderr, "dtlab: shader '%s' unavailable, drawing without it: %s\n", name.c_str(), error.c_str());
    return nullptr;
  }
  return &p;
}

void keep_libraries_loaded() {
#if DTLAB_ASAN
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void*) {
        // RTLD_NOLOAD: only what is loaded already; RTLD_NODELETE: never unloaded from now on.
        if (info->dlpi_name && info->dlpi_name[0]) dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        return 0;
      },
      nullptr);
#endif
}

}  // namespace dtlab::app
