// The shape of nanoGPT's GPT (docs/course_sources.md §6g): `gpt:layers=L,heads=H,embd=C,ctx=T[,vocab=V]`
// or a preset name. vocab 0 means "the data's vocabulary" (a text file's distinct characters), filled
// in by the trainer once the data is read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtlab {

// Context parallelism's layouts (--cp-layout; docs/strategies.md, "Context parallelism"; sources in
// docs/course_sources.md §6h). Ring: rank r keeps positions [r T/c, (r+1) T/c) of every sample and the
// K/V blocks travel the ring. Zigzag: the same ring with the sequence cut in 2c chunks, rank r keeping
// chunks r and 2c-1-r so the causal work balances. Ulysses: all-to-alls turn the sequence split into a
// head split around attention (DeepSpeed-Ulysses).
enum class CpLayout : uint8_t { Ring, Zigzag, Ulysses };
CpLayout parse_cp_layout(std::string_view name);  // "ring" | "zigzag" | "ulysses"; dtlab::Error otherwise
const char* cp_layout_name(CpLayout l);

// One rank's place in a context-parallel group (--cp; not part of GptSpec::str()): the sequence of
// every sample split over `degree` ranks, this rank holding T/degree positions in layout order.
struct ContextParallelSpec {
  int64_t degree = 1;
  int64_t rank = 0;
  CpLayout layout = CpLayout::Ring;
  bool on() const { return degree > 1; }
  bool ring() const { return on() && layout != CpLayout::Ulysses; }  // ring or zigzag: K/V blocks travel
  // The positions (of T) group rank `r` holds, in the order of its rows: [r T/c, (r+1) T/c), or
  // zigzag's chunk r then chunk 2c-1-r (each T/2c).
  std::vector<int64_t> positions_of(int64_t r, int64_t T) const;
  std::vector<int64_t> positions(int64_t T) const { return positions_of(rank, T); }
};

// A mixture of experts in place of chosen blocks' MLP (`--moe experts=E,top_k=K[,capacity=F][,every=N][,aux=A]`;
// docs/strategies.md, "Mixture of experts"). Megatron-core's MoE layer is the reference
// (docs/course_sources.md §6i): a linear router without bias, top-k of its logits with ties to the lower
// expert index, softmax over the k chosen logits (moe_router_pre_softmax off), capacity
// ceil(tokens x K / E x F) per expert with the tokens past it dropped in token order (drop policy
// "position"; F 0: no capacity, nothing dropped), and the Switch Transformer's load-balancing loss
// E x A / (K x T^2) x sum_e (sum_t softmax(logits)_te) x tokens_e, per micro-batch. Each expert is
// nanoGPT's MLP (c_fc, GELU, c_proj, with biases). Blocks l with l % every == 0 take it (moe_layer_freq).
struct MoeSpec {
  int64_t experts = 0;    // E (0: no MoE)
  int64_t top_k = 0;      // K
  double capacity = 0;    // F (0: dropless)
  int64_t every = 1;      // 1: every block; 2: blocks 0, 2, 4, ...
  double aux = 0.01;      // the load-balancing loss's coefficient (Switch Transformer's alpha)
  // Expert parallelism (--ep; not part of str()): the experts split over `ep` ranks, expert-parallel
  // rank `ep_rank` holding experts [ep_rank E/ep, (ep_rank + 1) E/ep) of each MoE block. A spec is
  // one rank's model: its parameter table lists only those experts (under their global numbers).
  int64_t ep = 1;
  int64_t ep_rank = 0;

  bool on() const { return experts > 0; }
  int64_t local_experts() const { return experts / ep; }
  int64_t first_expert() const { return ep_rank * local_experts(); }
  bool in_block(int64_t l) const { return on() && l % every == 0; }
  std::string str() const;  // "experts=4,top_k=2,capacity=1.25,every=2,aux=0.01" (capacity and every left out at 0 and 1)
  // Parses --moe's text; dtlab::Error with one sentence naming the wrong part and how to write it.
  static MoeSpec parse(std::string_view text);
};

struct GptSpec {
  int64_t layers = 0;  // n_layer
  int64_t heads = 0;   // n_head
  int64_t embd = 0;    // n_embd (C)
  int64_t ctx = 0;     // block_size (T): tokens per sample
  int64_t vocab = 0;   // vocab_size (V); 0: taken from the data
  MoeSpec moe = {};    // MoE blocks (off unless --moe)
  ContextParallelSpec cp = {};  // this rank's share of the sequence (--cp; the whole sequence by default)

  bool empty() const { return layers == 0; }
  int64_t head_size() const { return heads ? embd / heads : 0; }
  // nanoGPT's parameter count with the tied lm_head counted once (what named_parameters() lists):
  // wte V*C, wpe T*C, per block 12C^2 + 13C (an MoE block: 4C^2 + 8C, the router EC, and E experts
  // of 8C^2 + 5C), ln_f 2C.
  int64_t num_params() const;
  // Parameters of block l (the per-block part of num_params()).
  int64_t block_params(int64_t l) const;
  // The whole model: this spec with every expert (ep 1) and the whole sequence (no cp).
  GptSpec whole() const {
    GptSpec w = *this;
    w.moe.ep = 1;
    w.moe.ep_rank = 0;
    w.cp = {};
    return w;
  }
  // "gpt:layers=4,heads=4,embd=128,ctx=64,vocab=65" (vocab left out when 0). The MoE is not part of it
  // (it is --moe's, MoeSpec::str()).
  std::string str() const;

  // Parses the text after "gpt:" (or a whole preset name: "gpt-tiny", "gpt2-124m"); dtlab::Error with
  // one sentence naming the wrong part and how to write it.
  static GptSpec parse(std::string_view text);
  // "gpt:", "gpt-tiny" or "gpt2-124m": is this a GPT spec at all?
  static bool names_gpt(std::string_view text);
};

// A pipeline stage of the GPT: layers [first, end) in the numbering observers see (0 the embeddings,
// 1..L the blocks, L + 1 ln_f and the head); [0, L + 2) is the whole model. A stage holds at least
// one block.
struct GptRange {
  int first = 0, end = 0;
  bool whole(const GptSpec& s) const { return first == 0 && end == s.layers + 2; }
  bool embeds() const { return first == 0; }
  bool heads(const GptSpec& s) const { return end == s.layers + 2; }
  int first_block() const { return first == 0 ? 0 : first - 1; }        // blocks [first_block, end_block)
  int end_block(const GptSpec& s) const { return heads(s) ? static_cast<int>(s.layers) : end - 1; }
  static GptRange all(const GptSpec& s) { return {0, static_cast<int>(s.layers) + 2}; }
};

}  // namespace dtlab
