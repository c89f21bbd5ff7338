// rootclad/tree_reader.h: training batches from TTrees: the GW strain and labels
// (BatchReader) and any numeric columns with a target and weights (TableReader).
//
// Header-only; needs ROOT (TFile, TTree). Works included from a root.exe
// macro, declared from PyROOT through Cling, or compiled with g++ against
// ROOT's headers and libraries (-lCore -lRIO -lTree -lROOTNTuple; rootclad.root.flags gives
// them all).
//
// It follows the plan of rootclad/data/schedule.py (split, basket-aligned
// blocks, splitmix64 shuffling) exactly, so for the same files and settings
// it fills the same batches as rootclad.data.BatchIterator.
//
//   rootclad::data::BatchReader reader({"signal.root", "noise.root"});
//   reader.configure(/*batch_size=*/256, "train", /*validation_fraction=*/0.2,
//                    /*shuffle=*/true, /*seed=*/1);
//   std::vector<float> x(256 * reader.length());    // (B, N) row-major
//   std::vector<int> y(256);                        // (B,)
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     reader.start_epoch(epoch);
//     while (long long n = reader.next_batch(x.data(), y.data())) { /* n rows */ }
//   }
//
// Bad input throws std::runtime_error whose message names the file, tree,
// branch and entry ("<file>: tree 'events', branch 'strain', entry 12: ...").
// An epoch is never silently short: every planned entry is read or it throws.
#ifndef ROOTCLAD_TREE_READER_H
#define ROOTCLAD_TREE_READER_H

#include "data/batch_reader.h"
#include "data/table_reader.h"

#endif // ROOTCLAD_TREE_READER_H
