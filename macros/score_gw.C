// Score a GW dataset file with an exported rootclad model, in RDataFrame (C++ only).
//
//   root -l -b -q 'macros/score_gw.C("gw_test.root", "build/gwnet")'
//   root -l -b -q 'macros/score_gw.C+("gw_test.root", "build/gwnet", "scores")'   // ACLiC
//
// Defines a "score" column (the model's logit) and a "saliency" column (d score / d strain)
// with one rootclad::Model per processing slot (so ROOT::EnableImplicitMT() may be on), then
// writes OUT.root with the score histograms of noise (label 0) and signal (label 1), the ROC
// curve as a TGraph (false-alarm probability vs efficiency, AUC in its title), the ROC's floor
// (TParameter<double> "roc_floor": 1 / the number of noise events, the smallest false-alarm
// probability the file measures), the mean |saliency| of signal events per strain sample and
// the canvas; OUT.png draws the histograms and the ROC on a logarithmic false-alarm axis with
// the floor marked (below it the curve is not drawn: nothing there is measured).
// The GW layout: one float-array input column (the export's, else "strain") and an integer
// label (the export's target, else "label") in the tree "events".
// Prints the AUC. Both files are written whole or not at all (rootclad::write_root_file), and
// a failure returns 1 naming the file and the cause.
#include "../rootclad/include/rootclad/model.h"

#include <ROOT/RDataFrame.hxx>
#include <TCanvas.h>
#include <TGraph.h>
#include <TH1D.h>
#include <TLegend.h>
#include <TLine.h>
#include <TParameter.h>
#include <TProfile.h>
#include <TROOT.h>
#include <TStyle.h>
#include <TSystem.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {
// ROC from labelled scores: points (false-alarm probability, efficiency) for every threshold,
// and the area under it (the probability that a signal outscores a noise event, ties half).
std::pair<TGraph*, double> roc(std::vector<std::pair<double, int>> s) {
  std::sort(s.begin(), s.end(), [](auto& a, auto& b) { return a.first > b.first; });
  double n_sig = 0, n_bkg = 0;
  for (auto& [score, label] : s)
    (label ? n_sig : n_bkg) += 1;
  auto* g = new TGraph();
  g->SetPoint(0, 0.0, 0.0);
  double tp = 0, fp = 0, auc = 0;
  for (size_t i = 0; i < s.size();) {
    double dtp = 0, dfp = 0;
    const double score = s[i].first;
    for (; i < s.size() && s[i].first == score; ++i)
      (s[i].second ? dtp : dfp) += 1;
    auc += dfp * (tp + 0.5 * dtp);
    tp += dtp;
    fp += dfp;
    g->SetPoint(g->GetN(), n_bkg ? fp / n_bkg : 0, n_sig ? tp / n_sig : 0);
  }
  return {g, n_sig && n_bkg ? auc / (n_sig * n_bkg) : 0.0};
}
} // namespace

int score_gw(const char* file = "gw_test.root", const char* stem = "build/gwnet",
             const char* out = "score_gw") {
  try {
    const unsigned slots = std::max(1u, ROOT::GetThreadPoolSize());
    rootclad::SlotModels models(stem, slots);
    // the columns the model was exported with (cm.export(stem, schema=...)); else the GW ones
    const auto& columns = models[0].input_columns();
    if (columns.size() > 1)
      throw std::runtime_error(std::string("score_gw.C scores models of one input column; ") +
                               stem + " reads " + std::to_string(columns.size()));
    const std::string input = columns.empty() ? "strain" : columns[0];
    const std::string label =
        models[0].target_column().empty() ? "label" : models[0].target_column();
    ROOT::RDataFrame df("events", file);
    auto scored = df.DefineSlot("score",
                                [&models](unsigned slot, const ROOT::RVec<float>& x) {
                                  return models[slot].score(x);
                                },
                                {input})
                      .DefineSlot("saliency",
                                  [&models](unsigned slot, const ROOT::RVec<float>& x) {
                                    return models[slot].saliency(x);
                                  },
                                  {input});
    auto scores = scored.Take<double>("score");
    auto labels = scored.Take<int>(label);
    const int N = models[0].input_size();
    auto sal = scored.Filter([](int y) { return y == 1; }, {label})
                   .Define("abs_saliency", "ROOT::VecOps::abs(saliency)")
                   .Define("sample", [N] { return ROOT::VecOps::Range(N); })
                   .Profile1D({"saliency", "mean |d score / d strain|, signal;sample;|saliency|", N,
                               -0.5, N - 0.5},
                              "sample", "abs_saliency");
    // one event loop: the scores are taken, then histogrammed over their own range
    const auto [lo, hi] = std::minmax_element(scores->begin(), scores->end());
    const double pad = 0.05 * (*hi - *lo) + 1e-6;
    auto* noise = new TH1D("score_noise", "noise;score (logit);events", 60, *lo - pad, *hi + pad);
    auto* signal =
        new TH1D("score_signal", "signal;score (logit);events", 60, *lo - pad, *hi + pad);
    std::vector<std::pair<double, int>> s;
    double n_noise = 0;
    for (size_t i = 0; i < scores->size(); ++i) {
      s.emplace_back((*scores)[i], (*labels)[i]);
      ((*labels)[i] ? signal : noise)->Fill((*scores)[i]);
      n_noise += (*labels)[i] ? 0 : 1;
    }
    TGraph* graph;
    double auc;
    std::tie(graph, auc) = roc(std::move(s));
    graph->SetName("roc");
    const std::string roc_title = Form("ROC (AUC %.4f);false-alarm probability;efficiency", auc);
    graph->SetTitle(roc_title.c_str());
    // one noise event of this file: the smallest false-alarm probability it measures
    const double roc_floor = 1.0 / std::max(1.0, n_noise);
    gStyle->SetOptStat(0);
    TCanvas c("c", "score_gw", 1200, 500);
    c.Divide(2, 1);
    c.cd(1);
    signal->SetLineColor(kRed);
    noise->SetMaximum(1.15 * std::max(noise->GetMaximum(), signal->GetMaximum()));
    noise->Draw("hist");
    signal->Draw("hist same");
    TLegend legend(0.6, 0.75, 0.88, 0.88);
    legend.AddEntry(noise, "noise", "l");
    legend.AddEntry(signal, "signal", "l");
    legend.Draw();
    c.cd(2);
    gPad->SetLogx();
    gPad->DrawFrame(0.5 * roc_floor, 0, 1, 1.05, roc_title.c_str());
    // a log axis has no 0: the points at no false alarm are left out of the drawn curve
    TGraph shown;
    shown.SetName("roc_shown");
    for (int i = 0; i < graph->GetN(); ++i)
      if (graph->GetPointX(i) > 0)
        shown.SetPoint(shown.GetN(), graph->GetPointX(i), graph->GetPointY(i));
    shown.SetLineColor(kBlue);
    shown.SetLineWidth(2);
    shown.Draw("L");
    TLine line(roc_floor, 0, roc_floor, 1.05);
    line.SetLineStyle(kDashed);
    line.SetLineColor(kGray + 2);
    line.Draw();
    TLegend roc_legend(0.45, 0.15, 0.88, 0.3);
    roc_legend.AddEntry(&shown, Form("ROC, AUC %.4f", auc), "l");
    roc_legend.AddEntry(&line, Form("1 / noise events (%.1e)", roc_floor), "l");
    roc_legend.Draw();
    TParameter<double> floor_par("roc_floor", roc_floor);
    rootclad::write_root_file(std::string(out) + ".root", [&](TFile&) {
      noise->Write();
      signal->Write();
      sal->Write();
      graph->Write();
      floor_par.Write();
      c.Write("canvas");
    });
    // SaveAs only prints its errors: the image is drawn to a temporary name, then looked at
    // unique per process, so that two runs writing one output never share the temporary file
    const std::string png = std::string(out) + ".png";
    const std::string tmp =
        std::string(out) + "." + std::to_string(gSystem->GetPid()) + ".partial.png";
    c.SaveAs(tmp.c_str());
    FileStat_t st;
    if (gSystem->GetPathInfo(tmp.c_str(), st) != 0 || st.fSize == 0 ||
        std::rename(tmp.c_str(), png.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw std::runtime_error("cannot write " + png + " (ROOT's message is above)");
    }
    printf("AUC %.6f on %zu events; wrote %s.root and %s.png\n", auc, scores->size(), out, out);
  } catch (const std::exception& e) {
    fprintf(stderr, "score_gw: %s\n", e.what());
    return 1;
  }
  return 0;
}
