// onednn_conv.cpp — probe (not part of the build): ResNet-small's
// convolutions (batch 8) through oneDNN 2.6 (Debian's libdnnl-dev), with
// plain nchw tensors and with oneDNN's blocked layouts plus the reorders
// in and out, against a naive im2col + OpenBLAS sgemm. The lead for a
// CPU convolution extern step (see docs/benchmarks.md's bench-torch notes: on
// ResNet, OpenBLAS GEMMs and tccd's packs take ~50% of a step's samples
// where Inductor's oneDNN JIT convolutions take ~18%).
//
//   g++ -O2 tests/bench/probes/onednn_conv.cpp -o /tmp/onednn_conv -ldnnl -lopenblas
//   OMP_NUM_THREADS=2 /tmp/onednn_conv
//
// 2026-11-25, the 2-core VM, quiet (medians of 61): 16->16 3x3 at 16x16,
// blocked jit:avx2 with the reorders in and out: forward 158 us, backward
// data 145 us, backward weights 171 us; plain nchw (gemm:jit) forward
// 447 us; tccd's pack + sgemm ~400-550 us in a training step. The
// stride-2 16->32: blocked backward data 85 us, where tccd's col2im
// gather alone took ~450 us. Taken up: float32 convolutions are now
// oneDNN steps (compiler/conv.c, compiler/runtime/onednn_conv.c).

#include <oneapi/dnnl/dnnl.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <random>
using namespace dnnl;
extern "C" void cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
extern "C" void openblas_set_num_threads(int);
static double now(){return std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();}
template<class F> double med(F f){std::vector<double> t; for(int r=0;r<61;r++){double a=now(); f(); t.push_back(now()-a);} std::sort(t.begin(),t.end()); return t[30];}
int main(){
  engine eng(engine::kind::cpu,0); stream s(eng);
  struct S{int N,C,H,K,R,st,pad;} shapes[]={{8,16,16,16,3,1,1},{8,16,16,32,3,2,1},{8,32,8,32,3,1,1},{8,3,16,16,3,1,1}};
  std::mt19937 g(1); std::uniform_real_distribution<float> u(-1,1);
  for(auto sh: shapes){
    int N=sh.N,C=sh.C,H=sh.H,W=sh.H,K=sh.K,R=sh.R,st=sh.st,p=sh.pad;
    int OH=(H+2*p-R)/st+1, OW=OH;
    std::vector<float> x(N*C*H*W), w(K*C*R*R), y(N*K*OH*OW), gy(N*K*OH*OW), gx(N*C*H*W), gw(K*C*R*R);
    for(auto&v:x)v=u(g); for(auto&v:w)v=u(g); for(auto&v:gy)v=u(g);
    memory::dims xd={N,C,H,W}, wd={K,C,R,R}, yd={N,K,OH,OW}, sd={st,st}, pd={p,p};
    auto xm=memory::desc(xd,memory::data_type::f32,memory::format_tag::nchw);
    auto wm=memory::desc(wd,memory::data_type::f32,memory::format_tag::oihw);
    auto ym=memory::desc(yd,memory::data_type::f32,memory::format_tag::nchw);
    // plain formats
    auto xa=memory::desc(xd,memory::data_type::f32,memory::format_tag::any);
    auto wa=memory::desc(wd,memory::data_type::f32,memory::format_tag::any);
    auto ya=memory::desc(yd,memory::data_type::f32,memory::format_tag::any);
    auto fd=convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, xa,wa,ya,sd,pd,pd);
    auto fpd=convolution_forward::primitive_desc(fd,eng);
    {
      memory Xp(xm,eng,x.data()), Wp(wm,eng,w.data()), Yp(ym,eng,y.data());
      memory Xb(fpd.src_desc(),eng), Wb(fpd.weights_desc(),eng), Yb(fpd.dst_desc(),eng);
      reorder rx(Xp,Xb), rw(Wp,Wb), ry(Yb,Yp);
      convolution_forward cfb(fpd);
      double tb=med([&]{rx.execute(s,Xp,Xb); rw.execute(s,Wp,Wb); cfb.execute(s,{{DNNL_ARG_SRC,Xb},{DNNL_ARG_WEIGHTS,Wb},{DNNL_ARG_DST,Yb}}); ry.execute(s,Yb,Yp); s.wait();});
      double tc=med([&]{cfb.execute(s,{{DNNL_ARG_SRC,Xb},{DNNL_ARG_WEIGHTS,Wb},{DNNL_ARG_DST,Yb}}); s.wait();});
      // backward in blocked layouts: gy reordered in, gx / gw reordered out
      auto bda=convolution_backward_data::desc(algorithm::convolution_direct,xa,wa,ya,sd,pd,pd);
      auto bdap=convolution_backward_data::primitive_desc(bda,eng,fpd);
      auto bwa=convolution_backward_weights::desc(algorithm::convolution_direct,xa,wa,ya,sd,pd,pd);
      auto bwap=convolution_backward_weights::primitive_desc(bwa,eng,fpd);
      memory GYp(ym,eng,gy.data()), GXp(xm,eng,gx.data()), GWp(wm,eng,gw.data());
      memory GYb(bdap.diff_dst_desc(),eng), GXb(bdap.diff_src_desc(),eng), GWb(bwap.diff_weights_desc(),eng);
      memory GYw(bwap.diff_dst_desc(),eng), Xw(bwap.src_desc(),eng);
      reorder rgy(GYp,GYb), rgx(GXb,GXp), rgw(GWb,GWp), rgyw(GYp,GYw), rxw(Xp,Xw);
      convolution_backward_data cbdb(bdap); convolution_backward_weights cbwb(bwap);
      double tbd=med([&]{rgy.execute(s,GYp,GYb); rw.execute(s,Wp,Wb);
        cbdb.execute(s,{{DNNL_ARG_DIFF_DST,GYb},{DNNL_ARG_WEIGHTS,Wb},{DNNL_ARG_DIFF_SRC,GXb}});
        rgx.execute(s,GXb,GXp); s.wait();});
      double tbw=med([&]{rgyw.execute(s,GYp,GYw); rxw.execute(s,Xp,Xw);
        cbwb.execute(s,{{DNNL_ARG_SRC,Xw},{DNNL_ARG_DIFF_DST,GYw},{DNNL_ARG_DIFF_WEIGHTS,GWb}});
        rgw.execute(s,GWb,GWp); s.wait();});
      printf("  blocked [%s]: fwd conv alone %.1f us, with reorders %.1f; bwd_data [%s] %.1f, "
             "bwd_weights [%s] %.1f us (with reorders)\n", fpd.impl_info_str(), tc, tb,
             bdap.impl_info_str(), tbd, bwap.impl_info_str(), tbw);
    }
    fd=convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, xm,wm,ym,sd,pd,pd);
    fpd=convolution_forward::primitive_desc(fd,eng);
    memory X(xm,eng,x.data()),Wt(wm,eng,w.data()),Y(ym,eng,y.data()),GY(ym,eng,gy.data()),GX(xm,eng,gx.data()),GW(wm,eng,gw.data());
    convolution_forward cf(fpd);
    double tf=med([&]{cf.execute(s,{{DNNL_ARG_SRC,X},{DNNL_ARG_WEIGHTS,Wt},{DNNL_ARG_DST,Y}}); s.wait();});
    auto bdd=convolution_backward_data::desc(algorithm::convolution_direct,xm,wm,ym,sd,pd,pd);
    auto bdpd=convolution_backward_data::primitive_desc(bdd,eng,fpd);
    convolution_backward_data cbd(bdpd);
    double tbd=med([&]{cbd.execute(s,{{DNNL_ARG_DIFF_DST,GY},{DNNL_ARG_WEIGHTS,Wt},{DNNL_ARG_DIFF_SRC,GX}}); s.wait();});
    auto bwd=convolution_backward_weights::desc(algorithm::convolution_direct,xm,wm,ym,sd,pd,pd);
    auto bwpd=convolution_backward_weights::primitive_desc(bwd,eng,fpd);
    convolution_backward_weights cbw(bwpd);
    double tbw=med([&]{cbw.execute(s,{{DNNL_ARG_SRC,X},{DNNL_ARG_DIFF_DST,GY},{DNNL_ARG_DIFF_WEIGHTS,GW}}); s.wait();});
    // im2col + sgemm (openblas, 2 threads internally) for the forward
    int Kd=C*R*R, J=N*OH*OW;
    std::vector<float> col((size_t)Kd*J), c((size_t)K*J);
    openblas_set_num_threads(2);
    double tcol=med([&]{
      for(int ci=0;ci<C;ci++)for(int kh=0;kh<R;kh++)for(int kw=0;kw<R;kw++){
        float*row=&col[((size_t)(ci*R+kh)*R+kw)*J];
        for(int n=0;n<N;n++)for(int oh=0;oh<OH;oh++)for(int ow=0;ow<OW;ow++){
          int ih=oh*st-p+kh, iw=ow*st-p+kw;
          row[(n*OH+oh)*OW+ow]= (ih>=0&&ih<H&&iw>=0&&iw<W)? x[((n*C+ci)*H+ih)*W+iw]:0.f;}}});
    double tg=med([&]{cblas_sgemm(101,111,111,K,J,Kd,1,w.data(),Kd,col.data(),J,0,c.data(),J);});
    printf("N%d C%d %dx%d K%d %dx%d s%d: oneDNN fwd %6.1f bwd_data %6.1f bwd_w %6.1f us [%s] | im2col %6.1f + sgemm %6.1f us\n",
      N,C,H,W,K,R,R,st,tf,tbd,tbw,fpd.impl_info_str(),tcol,tg);
  }
}
