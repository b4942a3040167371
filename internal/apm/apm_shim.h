// The C interface of apm_shim.cc (package apm's cgo binding).
#ifndef SWITCHBOARD_APM_SHIM_H_
#define SWITCHBOARD_APM_SHIM_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sb_apm sb_apm;

typedef struct {
  int erl;           // echo return loss, dB (long-term average)
  int erle;          // echo return loss enhancement, dB (long-term average)
  int erle_instant;  // the same, the last measurement
  int has_echo;      // the AEC judged the last frame to hold echo
  int delay_median_ms;
  int delay_std_ms;
} sb_apm_echo;

// sb_apm_new returns a processor for mono frames of rate Hz, or NULL.
// ns_level: -1 off, 0-3 NoiseSuppression::Level (kLow to kVeryHigh).
sb_apm* sb_apm_new(int rate, int aec, int ns_level, int hpf);
void sb_apm_free(sb_apm* p);
int sb_apm_samples(const sb_apm* p);
int sb_apm_render(sb_apm* p, const int16_t* pcm);
int sb_apm_capture(sb_apm* p, int16_t* pcm, int delay_ms);
int sb_apm_echo_stats(sb_apm* p, sb_apm_echo* out);
float sb_apm_speech_probability(sb_apm* p);

#ifdef __cplusplus
}
#endif

#endif
