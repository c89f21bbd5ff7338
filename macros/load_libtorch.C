// Makes LibTorch usable in this ROOT session: the torch wheel's headers and rootclad's on the
// include path, its libraries loaded. Run it before a macro that includes <torch/torch.h>:
//
//   root -l -b -q macros/load_libtorch.C 'macros/train_libtorch.C("gw.root", "build/gwnet", 2)'
//
// The flags come from `python3 -m rootclad.torch.libtorch --cflags --libs` (the interpreter
// is the argument, e.g. "/path/to/venv/bin/python"). Parsing the torch headers takes Cling
// 15-25 s; rootclad/libtorch_trainer.h is the route that avoids them (see docs/root.md).
#include <TInterpreter.h>
#include <TObjArray.h>
#include <TObjString.h>
#include <TString.h>
#include <TSystem.h>

#include <cstdio>
#include <string>
#include <vector>

int load_libtorch(const char* python = "python3") {
  TString flags = gSystem->GetFromPipe(
      TString::Format("%s -m rootclad.torch.libtorch --cflags --libs 2>&1", python));
  if (!flags.Contains("-ltorch")) {
    fprintf(stderr, "load_libtorch: `%s -m rootclad.torch.libtorch` failed: %s\n", python,
            flags.Data());
    return 1;
  }
  std::unique_ptr<TObjArray> words(flags.Tokenize(" "));
  std::string libdir;
  std::vector<std::string> libs;
  for (int i = 0; i < words->GetEntriesFast(); ++i) {
    const TString w = static_cast<TObjString*>(words->At(i))->GetString();
    if (w == "-isystem" && i + 1 < words->GetEntriesFast())
      gInterpreter->AddIncludePath(static_cast<TObjString*>(words->At(++i))->GetString());
    else if (w.BeginsWith("-I"))
      gInterpreter->AddIncludePath(w(2, w.Length()).Data());
    else if (w.BeginsWith("-L"))
      libdir = w(2, w.Length()).Data();
    else if (w.BeginsWith("-l"))
      libs.push_back(w(2, w.Length()).Data());
    else if (w.BeginsWith("-D_GLIBCXX_USE_CXX11_ABI=") && w != "-D_GLIBCXX_USE_CXX11_ABI=1") {
      fprintf(stderr, "load_libtorch: this torch uses the pre-C++11 string ABI; ROOT does not\n");
      return 1;
    }
  }
  for (auto it = libs.rbegin(); it != libs.rend(); ++it) { // c10 first, torch last
    const std::string path = libdir.empty() ? "lib" + *it : libdir + "/lib" + *it + ".so";
    if (*it != "dl" && gSystem->Load(path.c_str()) < 0) {
      fprintf(stderr, "load_libtorch: cannot load %s\n", path.c_str());
      return 1;
    }
  }
  return 0;
}
