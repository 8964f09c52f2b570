/* llm_oscar_util.h — what llm_calibrate, llm_accuracy, llm_gpu_check and test_llm_oscar
   share: oscar contexts, rotation files as flat arrays, tokenized text, run metadata. */
#ifndef LLM_OSCAR_UTIL_H
#define LLM_OSCAR_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "llm_common.h"
#include "oscar.h"

/* An oscar context on the CPU backend or the CUDA backend (device 0). NULL on failure, with
   oscar's sentence in err. */
oscar_ctx *llm_oscar_setup(oscar_backend backend, char *err, size_t errlen);

/* Rotations of every layer 0..num_layers-1 as one malloc'd [num_layers][head_dim][head_dim]
   f32 array (x' = x @ R). From a rotation file (safetensors or .pt), or the normalised
   Hadamard of oscar_rotation_set_hadamard. NULL + sentence on failure. */
float *llm_load_rotations(const char *path, int32_t num_layers, int32_t head_dim, char *err, size_t errlen);
float *llm_hadamard_rotations(int32_t num_layers, int32_t head_dim, char *err, size_t errlen);
/* Saves [num_layers][D][D] rotations (and eigenvalues [num_layers][D] when not NULL) as a
   safetensors rotation file with the given objective. 0 on success. */
int llm_save_rotations(const char *path, const float *rot, const float *eig, int32_t num_layers, int32_t head_dim,
                       const char *objective, char *err, size_t errlen);

/* The covariance C = U Λ Uᵀ a calibrated rotation R = U·H·P_br was fitted to, from R and its
   ascending eigenvalues λ (OSCAR-SPEC.md §6.3: P_br sends the i-th largest eigen-direction to
   column bitreverse(i), so (U·H)[:, c] = R[:, perm⁻¹(c)], U = (U·H)·H). Unlike R itself it does
   not depend on how a solver picks eigenvectors inside (near-)degenerate eigenspaces, which
   post-RoPE covariances have: RoPE turns each high-frequency dim pair into a nearly isotropic
   2x2 block. U may be NULL; C is [D][D], U [D][D] (row-major), D a power of two <= 256. */
void llm_rotation_covariance(const float *R, const float *eig, int32_t D, double *C, double *U);

/* Tokens of a text file (no BOS). 0 on success. */
int llm_tokenize_file(const llm *L, const char *path, int32_t **ids, size_t *n_ids, size_t *n_bytes);

/* Metadata of a run: UTC date "YYYY-MM-DDTHH:MM:SSZ", the commit ($OSCAR_COMMIT, else `git
   rev-parse --short HEAD` of the working directory, else "unknown"), the command line. */
void llm_run_date(char *buf, size_t n);
void llm_run_commit(char *buf, size_t n);
void llm_run_command(int argc, char **argv, char *buf, size_t n);

/* log-softmax of logits at target, in double */
double llm_log_prob(const float *logits, int32_t n, int32_t target);
int32_t llm_argmax(const float *x, int32_t n);

#endif
