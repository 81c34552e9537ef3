// The data view (data_view.cpp) and what it keeps between frames, which the app owns: the
// coloring, the scatter's vertices and the split they show, and its GL objects.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "app/views/views.h"

namespace dtlab::app {

enum class ColorBy : int { Rank = 0, Class = 1 };

struct PointVertex {
  float x, y;   // data coordinates
  ImU32 color;  // RGBA bytes (IM_COL32 layout)
  float group;  // owner rank or class
};

// A GPT's text (token data): the Generate box samples from the model being trained; the app runs
// the request (Session::generate) and leaves the text or the reason here.
struct GenerateBox {
  char prompt[256] = "Shall I compare thee";
  bool request = false;      // the button was pressed this frame
  std::string output, error;  // the last answer
  std::string asked;          // the prompt it answered
  int64_t at_step = -1;       // the run's step when it was sampled
};

// A GPT's attention pattern (Session::attention): the chosen block and head, and what the app read
// for them while the run stood still.
struct AttentionBox {
  int layer = 0, head = 0;
  int layers = 0, heads = 0;  // the model's, for the sliders
  std::vector<float> probs;   // T x T, empty: nothing to show
  std::string text;           // the sample's characters (one per position)
  int64_t at_step = -1;
  uint64_t key = 0;           // what `probs` was read for (the stepper's generation, layer, head)
  std::string why_none;       // why this run has no pattern to show at all ("" when it has one)
};

struct DataViewState {
  ColorBy color_by = ColorBy::Rank;
  bool log_loss = true;
  int highlight = -1;  // legend entry under the mouse last frame, -1: none

  // What the vertex buffer holds, to refill it only when this changes.
  int64_t key_n = -1, key_epoch = -1;
  bool key_set_epoch = true;
  ColorBy key_color_by = ColorBy::Rank;
  int key_world = 0, key_classes = 0;
  std::vector<float> key_xy;
  std::vector<int16_t> key_owner;
  std::vector<int32_t> key_label;
  uint64_t version = 0;  // bumps on every refill
  std::vector<PointVertex> vertices;
  float min_x = 0, max_x = 1, min_y = 0, max_y = 1;

  // The split before the current one, to count how many samples changed rank.
  std::vector<int16_t> prev_owner;
  int64_t prev_epoch = -1, shown_epoch = -1;
  int64_t moved = -1;  // -1: nothing to compare with yet

  // GL objects (made on first use; left to the driver at exit, when the context is already gone).
  GlResources* gl = nullptr;
  unsigned vao = 0, vbo = 0;  // GLuint
  uint64_t uploaded_version = 0;
  // What the render target holds, to redraw it only when this changes.
  uint64_t drawn_version = 0;
  int drawn_w = 0, drawn_h = 0, drawn_highlight = -2;
  float drawn_point = 0;

  GenerateBox generate;
  AttentionBox attention;
};

void draw_data_view(const Snapshot& s, DataViewState& st, ViewContext& ctx);

}  // namespace dtlab::app
