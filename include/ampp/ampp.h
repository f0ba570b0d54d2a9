#pragma once
// ampp: automatic mixed precision and data-parallel training for LibTorch.
// One include for everything; each header also stands alone.
#if __has_include(<ampp/grad_scaler.h>)
#include <ampp/grad_scaler.h>
#endif
#if __has_include(<ampp/autocast.h>)
#include <ampp/autocast.h>
#endif
#if __has_include(<ampp/initialize.h>)
#include <ampp/initialize.h>
#endif
#if __has_include(<ampp/dist/dist.h>)
#include <ampp/dist/dist.h>
#endif
