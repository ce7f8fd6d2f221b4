/* fuzz_config.c: libFuzzer harness of config.json (dg_config_parse in
 * src/io/config.c). Input: the text of a config.json. Properties: an error has a
 * message; an accepted config has sizes the model code can rely on (positive,
 * within DG_MAX_LAYERS, top-k <= experts, per-layer head_dim and KV heads
 * positive, query heads a multiple of KV heads, EOS ids non-negative). */
#include "io/config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  dg_config cfg;
  dg_status rc = dg_config_parse("config.json", (const char *)d, n, &cfg);
  fz_check_error(rc);
  if (rc != DG_OK) return 0;
  if (cfg.vocab_size <= 0 || cfg.hidden_size <= 0 || cfg.n_heads <= 0 || cfg.canvas_length <= 0)
    fz_fail("accepted non-positive size (vocab %d hidden %d heads %d canvas %d)", cfg.vocab_size,
            cfg.hidden_size, cfg.n_heads, cfg.canvas_length);
  if (cfg.n_layers <= 0 || cfg.n_layers > DG_MAX_LAYERS) fz_fail("accepted n_layers %d", cfg.n_layers);
  if (cfg.n_experts < 0 || cfg.top_k_experts < 0 || cfg.top_k_experts > cfg.n_experts)
    fz_fail("accepted top_k %d of %d experts", cfg.top_k_experts, cfg.n_experts);
  for (int l = 0; l < cfg.n_layers; l++) {
    if (cfg.head_dim[l] <= 0 || cfg.n_kv_heads[l] <= 0) fz_fail("layer %d: head_dim %d kv %d", l, cfg.head_dim[l], cfg.n_kv_heads[l]);
    if (cfg.n_heads % cfg.n_kv_heads[l]) fz_fail("layer %d: %d heads over %d KV heads", l, cfg.n_heads, cfg.n_kv_heads[l]);
  }
  if (cfg.n_eos < 0 || cfg.n_eos > DG_MAX_STOP_IDS) fz_fail("n_eos %d", cfg.n_eos);
  for (int i = 0; i < cfg.n_eos; i++)
    if (cfg.eos_ids[i] < 0) fz_fail("eos id %d", cfg.eos_ids[i]);
  return 0;
}
