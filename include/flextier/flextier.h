/*
 * flextier/flextier.h - the whole public API in one include.
 *
 * Which library provides what (docs/architecture.md):
 *   flextier-codec   core.h, codec.h               (no UCX, no BLAS, no json-c)
 *   flextier-store   + store.h, agent.h            (UCX, libcrypto)
 *   flextier         + model.h, engine.h, offload.h, cuda.h, session.h
 * A program that links only flextier-codec includes core.h and codec.h
 * itself rather than this header, so that a call into a library it does
 * not link fails at compile time.
 *
 * pkg-config: flextier, flextier-store, flextier-codec; CMake:
 * find_package(flextier) with targets flextier::flextier, flextier::store,
 * flextier::codec (shared) and flextier::*_static.
 */
#ifndef FLEXTIER_FLEXTIER_H
#define FLEXTIER_FLEXTIER_H

#include "flextier/core.h"
#include "flextier/codec.h"
#include "flextier/store.h"
#include "flextier/agent.h"
#include "flextier/model.h"
#include "flextier/chat.h"
#include "flextier/engine.h"
#include "flextier/offload.h"
#include "flextier/cuda.h"
#include "flextier/train.h"
#include "flextier/session.h"
#include "flextier/server.h"

#endif
