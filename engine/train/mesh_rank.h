// A rank's process groups in a --tp run (the trainer's internals, shared by train.cpp and
// train_mesh.cpp): its TP group, whose collectives the model's layers call, and its DP group, over
// which DDP or FSDP run.
#pragma once
#include <memory>

#include "engine/comm/group.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/train/train.h"

namespace dtlab {

struct Trainer::MeshRank {
  Model* model = nullptr;
  std::shared_ptr<GroupExecutor> executor;
  std::unique_ptr<Communicator> tp_group, dp_group;
  Communicator* tp = nullptr;  // the world itself when the whole world is one TP group
  std::unique_ptr<GroupTensorParallelComm> tp_comm;
  ~MeshRank() {
    if (model) model->set_tensor_parallel_comm(nullptr);
  }
};

}  // namespace dtlab
