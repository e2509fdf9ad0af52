#include "parallel/comm/nccl_module.h"

#include "core/backend/cuda_module.h"
#include "core/util/status.h"

namespace dtrain {

absl::StatusOr<const NcclModule*> LoadNcclModule() {
  RETURN_IF_ERROR(LoadCudaModule().status());
  ASSIGN_OR_RETURN(void* entry, FindCudaModuleSymbol(kNcclModuleEntry));
  return reinterpret_cast<NcclModuleEntry>(entry)();
}

}  // namespace dtrain
