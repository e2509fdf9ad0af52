#include "parallel/comm/communicator.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

class FinishedWorkImpl : public Work {
 public:
  explicit FinishedWorkImpl(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

absl::Status CheckReduction(DataType type, ReduceOp op, const char* op_name,
                            const std::string& group) {
  if (op == ReduceOp::kAvg && (type == DataType::kI64 || type == DataType::kU64)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s on group '%s': an average of %s values is not an integer; sum them and divide "
        "where the rounding is known",
        op_name, group, DataTypeName(type)));
  }
  return absl::OkStatus();
}

absl::Status CheckPointToPoint(bool point_to_point, int rank, int size, int peer,
                               const std::string& op_name, const std::string& group) {
  if (!point_to_point) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s on group '%s': the group was created for collectives only (NCCL connects the pairs "
        "of a point-to-point group, the pipeline's)",
        op_name, group));
  }
  if (peer < 0 || peer >= size || peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s on group '%s': peer %d is not another member of a group of %d", op_name,
                        group, peer, size));
  }
  if (peer != (rank + 1) % size && peer != (rank + size - 1) % size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s on group '%s': member %d is not next to member %d on the group's ring, and NCCL "
        "connects each member to its previous and next one only (the pipeline's neighbouring "
        "stages)",
        op_name, group, peer, rank));
  }
  return absl::OkStatus();
}

std::unique_ptr<Work> FinishedWork(absl::Status status) {
  return std::make_unique<FinishedWorkImpl>(std::move(status));
}

absl::Status SumOverRanks(Communicator* comm, double& a, double& b) {
  if (!comm) return absl::OkStatus();
  double sums[2] = {a, b};
  RETURN_IF_ERROR(comm->AllReduce(sums, 2, ReduceOp::kSum)->Wait());
  a = sums[0];
  b = sums[1];
  return absl::OkStatus();
}

}  // namespace dtrain
