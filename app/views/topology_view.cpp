// The topology view: the run's hardware profile as a picture (docs/course_sources.md §6b). Nodes of
// GPUs (the ranks) on their fabric (NVSwitch, NVLink, PCIe switch), each node's NIC rails below, the
// network switch under all nodes; the links the shown step of the collective crosses light up with
// their load ("2 x 16 KiB"), red where transfers share a link. Everything comes from
// Snapshot::topology, which the SnapshotBuilder derives with CostModel::link_loads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

const ImU32 kIdleLink = IM_COL32(92, 98, 110, 255);

const LinkLoad* find_link(const TopologyView& t, LinkKind kind, int node, int index) {
  for (const LinkLoad& l : t.links)
    if (l.kind == kind && l.node == node && l.index == index) return &l;
  return nullptr;
}

std::string bytes_text(double b) { return human_bytes(static_cast<int64_t>(std::llround(b))); }

// "16 KiB", or "2 x 16 KiB" for a shared link.
std::string load_text(const LinkLoad& l, double bytes) {
  return l.load == 1 ? bytes_text(bytes) : std::to_string(l.load) + " x " + bytes_text(bytes);
}

// "370 GB/s, 3 µs"
std::string link_text(const Link& l) {
  char buf[64];
  if (l.beta <= 0) return "free";
  std::snprintf(buf, sizeof buf, "%.4g GB/s, %s", 1e-9 / l.beta, time_text(l.alpha).c_str());
  return buf;
}

const char* fabric_box_name(Fabric f) {
  switch (f) {
    case Fabric::NVSwitch: return "NVSwitch";
    case Fabric::PCIe: return "PCIe switch";
    case Fabric::NVLink: return "NVLink";
    case Fabric::SharedMemory: return "shared memory";
    default: return fabric_name(f);
  }
}

// A labeled box; `lit` outlines it in that color.
void box(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 fill, ImU32 edge, const std::string& label, float thick = 1.5f) {
  dl->AddRectFilled(a, b, fill, 4.0f);
  dl->AddRect(a, b, edge, 4.0f, 0, thick);
  const ImU32 ink = fill == kBox ? kText : ink_on(fill);
  if (ImGui::CalcTextSize(label.c_str()).x < b.x - a.x) centered_text(dl, ImVec2((a.x + b.x) * 0.5f, (a.y + b.y) * 0.5f), ink, label);
}

// A vertical link pair between y0 (top) and y1: the left line goes down (out of the box above),
// the right one up (into it). Lit lines are thick and carry their load as text beside them.
struct LinkPair {
  const LinkLoad* down;
  const LinkLoad* up;
};
void draw_link_pair(ImDrawList* dl, float x, float y0, float y1, float gap, LinkPair p, const TopologyView& t,
                    bool labels) {
  const float fs = ImGui::GetFontSize();
  const LinkLoad* lines[2] = {p.down, p.up};
  for (int i = 0; i < 2; i++) {
    const LinkLoad* l = lines[i];
    const float lx = x + (i == 0 ? -gap : gap);
    const ImU32 col = l ? link_load_color(t.phase, l->load) : kIdleLink;
    const float w = l ? std::min(2.5f + 1.5f * static_cast<float>(l->load), 9.0f) : 1.5f;
    dl->AddLine(ImVec2(lx, y0), ImVec2(lx, y1), col, w);
    // the arrowhead shows the direction
    const float ay = i == 0 ? y1 - 2 : y0 + 2, dir = i == 0 ? -1.0f : 1.0f, ah = fs * 0.45f;
    dl->AddTriangleFilled(ImVec2(lx, ay), ImVec2(lx - ah * 0.6f, ay + dir * ah), ImVec2(lx + ah * 0.6f, ay + dir * ah), col);
    if (!l || !labels) continue;
    const std::string s = load_text(*l, t.bytes);
    const ImVec2 sz = ImGui::CalcTextSize(s.c_str());
    const float ty = i == 0 ? y0 + (y1 - y0) * 0.30f - sz.y * 0.5f : y0 + (y1 - y0) * 0.62f - sz.y * 0.5f;
    const float tx = i == 0 ? lx - fs * 0.3f - sz.x : lx + fs * 0.3f;
    dl->AddRectFilled(ImVec2(tx - 2, ty - 1), ImVec2(tx + sz.x + 2, ty + sz.y + 1), IM_COL32(20, 22, 26, 220), 3.0f);
    dl->AddText(ImVec2(tx, ty), col, s.c_str());
  }
}

bool busy(const TopologyView& t, int rank) {
  return std::any_of(t.transfers.begin(), t.transfers.end(), [&](const StepTransfer& x) { return x.src == rank || x.dst == rank; });
}

// The vertical bands of a node's picture and of the network under the nodes.
struct Bands {
  float title, gpu0, gpu1, fabric0, fabric1, nic0, nic1, net0, net1;
};

Bands bands(float y0, float y1, bool network, float fs) {
  Bands b{};
  const float h = y1 - y0;
  const float unit = std::clamp(h / (network ? 24.0f : 14.0f), fs * 0.9f, fs * 2.2f);
  // The boxes keep their heights; the gaps the links run in (GPUs to fabric, NICs to the network) shrink
  // to fit a short window (presentation mode at 1280 x 720 cut the switch off the bottom).
  const float gpu_h = std::max(unit * 2.2f, fs * 2.2f), fabric_h = std::max(unit * 1.6f, fs * 1.6f);
  const float nic_h = std::max(unit * 2.4f, fs * 2.6f), net_h = std::max(unit * 1.8f, fs * 1.6f), nic_gap = unit * 1.2f;
  float up = unit * (network ? 5.0f : 7.0f), down = network ? unit * 5.0f : 0.0f;
  const float fixed = fs * 1.6f + gpu_h + fabric_h + (network ? nic_gap + nic_h + net_h : fs * 2.0f);
  if (up + down > h - fixed) {
    const float k = std::max(h - fixed, fs * 2.5f) / (up + down);
    up *= k, down *= k;
  }
  b.title = y0 + unit * 0.2f;
  b.gpu0 = y0 + fs * 1.6f;
  b.gpu1 = b.gpu0 + gpu_h;
  b.fabric0 = b.gpu1 + up;
  b.fabric1 = b.fabric0 + fabric_h;
  b.nic0 = b.fabric1 + nic_gap;
  b.nic1 = b.nic0 + nic_h;
  b.net0 = b.nic1 + down;
  b.net1 = std::min(b.net0 + net_h, y1);
  return b;
}

// One node: its GPUs, their ports to the fabric, the fabric, and (across nodes) its NICs.
void draw_node(ImDrawList* dl, const TopologyView& t, int node, ImVec2 a, ImVec2 b, const Bands& y, bool network) {
  const HardwareProfile& P = t.profile;
  const float fs = ImGui::GetFontSize();
  const int G = P.gpus_per_node, first = node * G, count = std::min(G, t.world - first);
  const int rails = std::max(1, std::min(P.rails, G));
  dl->AddRect(a, b, kBoxEdge, 8.0f, 0, 1.5f);
  dl->AddText(ImVec2(a.x + fs * 0.5f, y.title), kDim, ("node " + std::to_string(node)).c_str());
  const float slot = (b.x - a.x - fs) / static_cast<float>(std::max(count, 1));
  // Two labels per GPU need room; narrower, only shared links are labeled (the header gives the bytes).
  const bool labels = slot > fs * 8.0f;
  auto gpu_x = [&](int local) { return a.x + fs * 0.5f + slot * (static_cast<float>(local) + 0.5f); };
  const float half = std::min(slot * 0.40f, fs * 3.2f);
  for (int l = 0; l < count; l++) {
    const int r = first + l;
    const float x = gpu_x(l);
    draw_link_pair(dl, x, y.gpu1, y.fabric0, std::max(half * 0.35f, 3.0f),
                   {find_link(t, LinkKind::PortOut, node, r), find_link(t, LinkKind::PortIn, node, r)}, t, labels);
    const bool active = busy(t, r);
    const std::string name = "GPU " + std::to_string(r);
    box(dl, ImVec2(x - half, y.gpu0), ImVec2(x + half, y.gpu1), rank_color(r, t.world, active ? 1.0f : 0.55f),
        active ? kText : kBoxEdge, ImGui::CalcTextSize(name.c_str()).x < half * 1.8f ? name : std::to_string(r),
        active ? 3.0f : 1.5f);
  }
  const LinkLoad* sw = find_link(t, LinkKind::Switch, node, 0);
  std::string fabric = std::string(fabric_box_name(P.intra_fabric)) + (P.switch_reduces ? " (NVLS: reduces)" : "");
  if (sw) fabric += ": " + std::to_string(sw->load) + " chunks";
  box(dl, ImVec2(a.x + fs * 0.5f, y.fabric0), ImVec2(b.x - fs * 0.5f, y.fabric1), sw ? IM_COL32(70, 60, 40, 255) : kBox,
      sw ? link_load_color(t.phase, 1) : kBoxEdge, fabric, sw ? 3.0f : 1.5f);
  if (!network) return;
  const float nslot = (b.x - a.x - fs) / static_cast<float>(rails);
  const float nhalf = std::min(nslot * 0.42f, fs * (rails < G ? 6.5f : 3.2f));
  // One rail per GPU: the NIC sits under its GPU; fewer rails: spread out, naming their GPUs.
  auto nic_x = [&](int k) { return rails == G ? gpu_x(k) : a.x + fs * 0.5f + nslot * (static_cast<float>(k) + 0.5f); };
  // A GPU sending or receiving across nodes reaches its NIC through the node (thin: not a charged link).
  for (const StepTransfer& x : t.transfers)
    for (int r : {x.src, x.dst})
      if (r >= first && r < first + count && x.src >= 0 && x.dst >= 0 && x.src / G != x.dst / G)
        dl->AddLine(ImVec2(gpu_x(r - first), y.gpu1), ImVec2(nic_x((r - first) % rails), y.nic0),
                    with_alpha(link_load_color(t.phase, 1), 0.6f), 1.5f);
  for (int k = 0; k < rails; k++) {
    const float x = nic_x(k);
    std::string label = "NIC " + std::to_string(k);
    if (rails < G && nslot > fs * 6) {
      label += ": GPU";
      for (int l = k; l < count; l += rails) label += " " + std::to_string(first + l);
    }
    const bool used = find_link(t, LinkKind::RailOut, node, k) || find_link(t, LinkKind::RailIn, node, k);
    box(dl, ImVec2(x - nhalf, y.nic0), ImVec2(x + nhalf, y.nic1), used ? IM_COL32(40, 70, 90, 255) : kBox,
        used ? kText : kBoxEdge, nslot > fs * 3.0f ? label : std::to_string(k), used ? 3.0f : 1.5f);
    draw_link_pair(dl, x, y.nic1, y.net0, std::max(nhalf * 0.35f, 3.0f),
                   {find_link(t, LinkKind::RailOut, node, k), find_link(t, LinkKind::RailIn, node, k)}, t, nslot > fs * 4.0f);
  }
}

// Two lines over the picture: the profile and its links, then the step and its slowest link.
void header(const TopologyView& t, int nodes) {
  const HardwareProfile& P = t.profile;
  ImGui::TextWrapped("%s: %s", P.name.c_str(), P.description.c_str());
  std::string links = std::string(fabric_box_name(P.intra_fabric)) + " " + link_text(P.intra) + " per GPU port each way";
  if (nodes > 1)
    links += "; " + std::string(fabric_name(P.inter_fabric)) + " " + link_text(P.inter) + " per NIC each way, " +
             std::to_string(std::max(1, P.rails)) + (P.rails == 1 ? " NIC" : " NICs") + " per node";
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("%s", links.c_str());
  ImGui::PopTextWrapPos();
  if (t.step < 0) {
    ImGui::TextWrapped("No collective step to show yet: step a collective (C, or R for one step) to light its links.");
    return;
  }
  const LinkLoad* slow = nullptr;
  for (const LinkLoad& l : t.links)
    if (!slow || l.seconds > slow->seconds) slow = &l;
  std::string where = slow ? std::string(link_kind_name(slow->kind)) : "";
  if (slow && slow->kind != LinkKind::Switch)
    where += slow->kind == LinkKind::PortOut || slow->kind == LinkKind::PortIn ? " of GPU " + std::to_string(slow->index)
                                                                              : " " + std::to_string(slow->index) + " of node " + std::to_string(slow->node);
  ImGui::TextWrapped("step %d of %d: %zu transfers of %s each, %s; slowest link: %s (%s)%s", t.step + 1, t.steps,
                     t.transfers.size(), bytes_text(t.bytes).c_str(), time_text(t.seconds).c_str(), where.c_str(),
                     slow ? load_text(*slow, t.bytes).c_str() : "", slow && slow->load > 1 ? ": shared, so slower" : "");
}

}  // namespace

void draw_topology_view(const Snapshot& s, ViewContext& ctx) {
  (void)ctx;
  const TopologyView& t = s.topology;
  if (!t.valid) {
    ImGui::TextWrapped("No hardware profile: this run has no cost model to draw.");
    return;
  }
  const int G = std::max(1, t.profile.gpus_per_node);
  const int nodes = std::max(1, (t.world + G - 1) / G);
  header(t, nodes);
  const ImVec2 p0 = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  if (avail.x < 50 || avail.y < 50) return;
  ImGui::Dummy(avail);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize(), gap = fs * 0.8f;
  const bool network = nodes > 1;
  const Bands y = bands(p0.y + fs * 0.3f, p0.y + avail.y - fs * 0.3f, network, fs);
  const float w = (avail.x - gap * static_cast<float>(nodes + 1)) / static_cast<float>(nodes);
  for (int n = 0; n < nodes; n++) {
    const float x0 = p0.x + gap + static_cast<float>(n) * (w + gap);
    draw_node(dl, t, n, ImVec2(x0, p0.y + fs * 0.3f), ImVec2(x0 + w, network ? y.nic1 + fs * 0.6f : y.fabric1 + fs * 0.8f), y,
              network);
  }
  if (!network) {
    if (t.profile.rails > 0 && t.profile.inter_fabric != t.profile.intra_fabric)
      dl->AddText(ImVec2(p0.x + gap, y.fabric1 + fs * 1.4f), kDim,
                  (std::to_string(t.profile.rails) + " " + fabric_name(t.profile.inter_fabric) +
                   " NICs lead to other nodes (a world beyond one node uses them)").c_str());
    return;
  }
  const LinkLoad* sw = find_link(t, LinkKind::Switch, -1, 0);
  std::string net = std::string(fabric_name(t.profile.inter_fabric)) + " switch" + (t.profile.switch_reduces ? " (SHARP: reduces)" : "");
  if (sw) net += ": " + std::to_string(sw->load) + " chunks";
  box(dl, ImVec2(p0.x + gap, y.net0), ImVec2(p0.x + avail.x - gap, y.net1), sw ? IM_COL32(70, 60, 40, 255) : kBox,
      sw ? link_load_color(t.phase, 1) : kBoxEdge, net, sw ? 3.0f : 1.5f);
}

}  // namespace dtlab::app
