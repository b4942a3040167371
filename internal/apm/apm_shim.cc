//go:build cgo

// A C interface over WebRTC's audio processing module (AudioProcessing,
// webrtc/modules/audio_processing/include/audio_processing.h) as Debian's
// libwebrtc-audio-processing 0.3 installs it, for cgo, which cannot call
// C++. It exposes what package apm uses: the echo canceller (AEC, with the
// extended filter and delay-agnostic mode), the noise suppressor and the
// high-pass filter, on 10 ms mono 16-bit frames.

#include <stdint.h>

#include "webrtc/modules/audio_processing/include/audio_processing.h"

#include "apm_shim.h"

struct sb_apm {
  webrtc::AudioProcessing* apm;
  webrtc::StreamConfig cfg;
  int samples;
  float buf[480];  // one 10 ms frame at up to 48 kHz
};

static void to_float(const int16_t* in, float* out, int n) {
  for (int i = 0; i < n; i++) out[i] = in[i] / 32768.0f;
}

static void to_int16(const float* in, int16_t* out, int n) {
  for (int i = 0; i < n; i++) {
    float v = in[i] * 32768.0f;
    if (v > 32767.0f) v = 32767.0f;
    if (v < -32768.0f) v = -32768.0f;
    out[i] = (int16_t)(v + (v >= 0 ? 0.5f : -0.5f));
  }
}

extern "C" sb_apm* sb_apm_new(int rate, int aec, int ns_level, int hpf) {
  if (rate <= 0 || rate > 48000 || rate % 100 != 0) return nullptr;
  webrtc::Config config;
  config.Set<webrtc::ExtendedFilter>(new webrtc::ExtendedFilter(true));
  config.Set<webrtc::DelayAgnostic>(new webrtc::DelayAgnostic(true));
  config.Set<webrtc::ExperimentalAgc>(new webrtc::ExperimentalAgc(false));
  webrtc::AudioProcessing* apm = webrtc::AudioProcessing::Create(config);
  if (apm == nullptr) return nullptr;
  webrtc::ProcessingConfig pc;
  for (int i = 0; i < webrtc::ProcessingConfig::kNumStreamNames; i++) {
    pc.streams[i] = webrtc::StreamConfig(rate, 1, false);
  }
  if (apm->Initialize(pc) != webrtc::AudioProcessing::kNoError ||
      apm->high_pass_filter()->Enable(hpf != 0) != 0 ||
      apm->gain_control()->Enable(false) != 0) {
    delete apm;
    return nullptr;
  }
  if (aec) {
    webrtc::EchoCancellation* ec = apm->echo_cancellation();
    if (ec->Enable(true) != 0 || ec->enable_drift_compensation(false) != 0 ||
        ec->set_suppression_level(webrtc::EchoCancellation::kHighSuppression) != 0 ||
        ec->enable_metrics(true) != 0 || ec->enable_delay_logging(true) != 0) {
      delete apm;
      return nullptr;
    }
  }
  if (ns_level >= 0) {
    webrtc::NoiseSuppression* ns = apm->noise_suppression();
    if (ns->set_level(static_cast<webrtc::NoiseSuppression::Level>(ns_level)) != 0 ||
        ns->Enable(true) != 0) {
      delete apm;
      return nullptr;
    }
  }
  sb_apm* p = new sb_apm;
  p->apm = apm;
  p->cfg = webrtc::StreamConfig(rate, 1, false);
  p->samples = rate / 100;
  return p;
}

extern "C" void sb_apm_free(sb_apm* p) {
  if (p == nullptr) return;
  delete p->apm;
  delete p;
}

extern "C" int sb_apm_samples(const sb_apm* p) { return p->samples; }

extern "C" int sb_apm_render(sb_apm* p, const int16_t* pcm) {
  to_float(pcm, p->buf, p->samples);
  float* ch[1] = {p->buf};
  return p->apm->ProcessReverseStream(ch, p->cfg, p->cfg, ch);
}

extern "C" int sb_apm_capture(sb_apm* p, int16_t* pcm, int delay_ms) {
  to_float(pcm, p->buf, p->samples);
  float* ch[1] = {p->buf};
  // An out-of-range delay comes back as kBadStreamParameterWarning, and
  // the value is clamped: not an error for the frame.
  p->apm->set_stream_delay_ms(delay_ms);
  int err = p->apm->ProcessStream(ch, p->cfg, p->cfg, ch);
  if (err != webrtc::AudioProcessing::kNoError) return err;
  to_int16(p->buf, pcm, p->samples);
  return 0;
}

extern "C" int sb_apm_echo_stats(sb_apm* p, sb_apm_echo* out) {
  webrtc::EchoCancellation* ec = p->apm->echo_cancellation();
  if (!ec->is_enabled()) return webrtc::AudioProcessing::kNotEnabledError;
  webrtc::EchoCancellation::Metrics m;
  int err = ec->GetMetrics(&m);
  if (err != 0) return err;
  out->erl = m.echo_return_loss.average;
  out->erle = m.echo_return_loss_enhancement.average;
  out->erle_instant = m.echo_return_loss_enhancement.instant;
  out->has_echo = ec->stream_has_echo() ? 1 : 0;
  int median = 0, std = 0;
  float poor = 0;
  if (ec->GetDelayMetrics(&median, &std, &poor) == 0) {
    out->delay_median_ms = median;
    out->delay_std_ms = std;
  }
  return 0;
}

extern "C" float sb_apm_speech_probability(sb_apm* p) {
  return p->apm->noise_suppression()->speech_probability();
}
