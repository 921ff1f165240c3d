/*
 * acl/acl.h - the ACL API of runtime's virtual devices: include this one header.
 *
 * The runtime functions (devices, contexts, streams, events, memory, callbacks) are in
 * acl_rt.h; acl_op.h and acl_mdl.h declare only the operator and model types.
 * Build: cc prog.c $(python -m runtime.acl --cflags) $(python -m runtime.acl --libs)
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef RUNTIME_ACL_ACL_H
#define RUNTIME_ACL_ACL_H

#include "acl_rt.h"
#include "acl_op.h"
#include "acl_mdl.h"

#endif /* RUNTIME_ACL_ACL_H */
