// The trainer's metrics before issue 11 moved the step's verdict to the device: recorded from commit
// 8e36b69 (`octet train configN.toml`, the configs of trainer_lagged_test.cpp, on the CPU) with
// scripts written for the purpose; the loss, grad_norm, lr and MTP loss as exact hexadecimal floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace octet::test {

struct GoldenStep {
  int64_t step;
  double loss, grad_norm, lr, mtp;
  bool skipped;
  std::string skip_reason;
  double router_imbalance, shadow;  // -1: not in the record
  size_t sites;                     // sites recorded
};

// clang-format off
inline const std::vector<GoldenStep> kLaggedGolden[2] = {
    {
    {1, 0x1.62dd3b0000000p+2, 0x1.723cb00000000p+0, 0x1.0000000000000p+0, 0x1.60ba810000000p+2, false, "", 0x1.e000000000000p+0, -0x1.0000000000000p+0, 26},
    {2, 0x1.fd8ddd0000000p+3, 0x1.95766a0000000p+6, 0x1.0000000000000p+0, 0x1.190aaf0000000p+4, false, "", 0x1.6000000000000p+1, -0x1.0000000000000p+0, 0},
    {3, 0x1.43fff50000000p+4, 0x1.7b8dfa0000000p+7, 0x1.0000000000000p+0, 0x1.599c640000000p+4, false, "", 0x1.5000000000000p+1, -0x1.0000000000000p+0, 0},
    {4, 0x1.02153f8000000p+4, 0x1.0f78420000000p+3, 0x1.0000000000000p+0, 0x1.70f85c0000000p+4, false, "", 0x1.3000000000000p+1, -0x1.0000000000000p+0, 0},
    {5, 0x1.babbeb0000000p+3, 0x1.b599200000000p+3, 0x1.0000000000000p+0, 0x1.a238580000000p+4, false, "", 0x1.e000000000000p+1, -0x1.0000000000000p+0, 0},
    {6, 0x1.e419c20000000p+3, 0x1.3d9fd60000000p+5, 0x1.0000000000000p+0, 0x1.80ad2f0000000p+4, false, "", 0x1.0000000000000p+2, -0x1.0000000000000p+0, 0},
    {7, 0x1.4121310000000p+4, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.ad148d0000000p+4, true, "loss spike (no checkpoint to roll back to)", 0x1.0000000000000p+2, -0x1.0000000000000p+0, 0},
    {8, 0x1.28da010000000p+4, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.a3a9d50000000p+4, true, "loss spike (no checkpoint to roll back to)", 0x1.0000000000000p+2, -0x1.0000000000000p+0, 0},
    {9, 0x1.3dc9e50000000p+4, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.bd3c9c0000000p+4, true, "loss spike (no checkpoint to roll back to)", 0x1.0000000000000p+2, -0x1.0000000000000p+0, 0},
    {10, 0x1.6484830000000p+4, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.abdf910000000p+4, true, "loss spike (no checkpoint to roll back to)", 0x1.0000000000000p+2, -0x1.0000000000000p+0, 0},
    },
    {
    {1, 0x1.62e3070000000p+2, 0x1.712cb00000000p+0, 0x1.0000000000000p+0, 0x1.60be4b0000000p+2, false, "", 0x1.e000000000000p+0, -0x1.0000000000000p+0, 24},
    {2, 0x1.d84f590000000p+3, 0x1.c7c79a0000000p+5, 0x1.0000000000000p+0, 0x1.1affcf0000000p+4, false, "", 0x1.4000000000000p+1, -0x1.0000000000000p+0, 0},
    {3, 0x1.e78a830000000p+4, 0x1.3e7ec40000000p+4, 0x1.0000000000000p+0, 0x1.7d8c900000000p+4, false, "", 0x1.9000000000000p+1, 0x1.daafc00000000p+4, 0},
    {4, 0x1.0c1f250000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.7aa7ef0000000p+4, true, "loss spike", 0x1.e000000000000p+1, -0x1.0000000000000p+0, 24},
    {5, 0x1.06587a0000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.8bbf7d0000000p+4, true, "loss spike", 0x1.f000000000000p+1, -0x1.0000000000000p+0, 0},
    {6, 0x1.0b2f9e0000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.8f08b00000000p+4, true, "loss spike", 0x1.e000000000000p+1, 0x1.0cf7240000000p+5, 0},
    {7, 0x1.0490ac0000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.8700f10000000p+4, true, "loss spike", 0x1.f000000000000p+1, -0x1.0000000000000p+0, 0},
    {8, 0x1.05a06f0000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.683d600000000p+4, true, "loss spike", 0x1.f000000000000p+1, -0x1.0000000000000p+0, 24},
    {9, 0x1.0d05c60000000p+5, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.6f17350000000p+4, true, "loss spike", 0x1.0000000000000p+2, 0x1.fff6880000000p+4, 0},
    {10, 0x1.fe423b0000000p+4, 0x0.0p+0, 0x1.0000000000000p+0, 0x1.a6488b0000000p+4, true, "loss spike", 0x1.f000000000000p+1, -0x1.0000000000000p+0, 0},
    }
};
// clang-format on
inline constexpr int kLaggedGoldenRollbacks[2] = {8, 0};
inline constexpr int kLaggedGoldenSpikeLines[2] = {20, 21};
inline constexpr int kLaggedGoldenSkipped[2] = {4, 7};

}  // namespace octet::test
