# Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.
