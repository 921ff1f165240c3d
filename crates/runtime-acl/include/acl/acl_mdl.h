/*
 * acl/acl_mdl.h - model loading and execution. The C library of runtime provides the runtime
 * API only (acl_rt.h); this header exists because acl/acl.h includes it, and declares the
 * model types so that code naming them compiles.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef RUNTIME_ACL_ACL_MDL_H
#define RUNTIME_ACL_ACL_MDL_H

#include "acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct aclmdlDataset aclmdlDataset;
typedef struct aclmdlDesc aclmdlDesc;

#ifdef __cplusplus
}
#endif

#endif /* RUNTIME_ACL_ACL_MDL_H */
