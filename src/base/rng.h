/* rng.h: counter-based random numbers (Philox4x32-10, Salmon et al., SC'11,
 * "Parallel random numbers: as easy as 1, 2, 3"), so that a seeded run draws
 * the same numbers on every backend and in any order.
 *
 * A draw is addressed by (seed, stream, block, step, index): the counter is
 * {index/4, step, block, stream}, the key is the 64-bit seed, and lane
 * index%4 of the output is used. */
#ifndef DG_RNG_H
#define DG_RNG_H

#include <stdint.h>

enum { DG_RNG_CANVAS = 1, DG_RNG_PROPOSAL = 2, DG_RNG_INIT = 3 /* weight init, src/writers/mkrandom.h */ };

/* One Philox4x32-10 block: out = philox(ctr, key). */
void dg_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* out[i] for i in [0, n): 32 random bits for draw (seed, stream, block, step, i). */
void dg_rng_u32(uint64_t seed, uint32_t stream, uint32_t block, uint32_t step, uint32_t n, uint32_t *out);

/* Uniform token id in [0, V) from 32 random bits (multiply-high; bias < V/2^32). */
static inline int32_t dg_rng_to_id(uint32_t r, int32_t V) { return (int32_t)(((uint64_t)r * (uint64_t)V) >> 32); }

/* Uniform float in [0, 1) with 24 random bits. */
static inline float dg_rng_to_unit(uint32_t r) { return (float)(r >> 8) * (1.0f / 16777216.0f); }

#endif
